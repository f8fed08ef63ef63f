"""The sim2sim verification record beside a model: ``<model stem>.verify.json``.

Written by ``claw-rl verify``; read here by the deploy path (RL only with a passing record of
exactly this model) and by the policy card. Format::

    {"model_sha256": "<hex>", "passed": true|false, "table": [...], "created": "<ISO time>"}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..io import read_json_object

SUFFIX = '.verify.json'


def verification_path(model: str | Path) -> Path:
    """``runs/x/student.onnx`` -> ``runs/x/student.verify.json``."""
    return Path(model).with_suffix(SUFFIX)


def read_verification(model: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """(path, record) of the verification file beside ``model``; None if there is none.

    Raises ValueError (path, problem, fix) for a file that is not a JSON object.
    """
    path = verification_path(model)
    record = read_json_object(path, 're-run claw-rl verify')
    return None if record is None else (path, record)


def verification_blocker(model: str | Path | None, sha256: str) -> str | None:
    """None when a passing verification of exactly these model bytes lies beside ``model``;
    otherwise the reason, naming the file and the fix."""
    fix = ('run `claw-rl verify --model <model>` (or set require_verification false to deploy '
           'an unverified model)')
    if model is None:
        return f'model {sha256[:12]} came as bytes, with no verification file; {fix}'
    try:
        found = read_verification(model)
    except ValueError as exc:
        return str(exc)
    if found is None:
        return f'no {verification_path(model).name} beside {model}; {fix}'
    path, record = found
    if record.get('model_sha256') != sha256:
        return (f'{path} verifies model {str(record.get("model_sha256"))[:12]}, not the served '
                f'{sha256[:12]}; {fix}')
    if record.get('passed') is not True:
        return f'{path}: verification did not pass (passed = {record.get("passed")!r}); {fix}'
    return None
