"""The drive-gains record beside a model: ``<model stem>.drive.json``.

Written by the policy node's self-check (core/control/drive_gains.py) for a model loaded from a
file: how the robot's drives got their gains when the model was last checked on a robot (sent
with every command, or declared and compared with the model's). Read by the policy card.
Format::

    {"model_sha256": "<hex>", "source": "sent" | "declared", "verdict": "sent" | "within" |
     "differs" | "not declared" | "not received", "kp": [...], "kd": [...] (declared, the
     ``joints`` order), "joints": [...], "tolerance": 0.05, "topic": "/joint_gains" (sent),
     "problems": ["drive gains: ..."], "node": "/policy_node", "created": "<ISO time>"}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..io import read_json_object

SUFFIX = '.drive.json'


def drive_path(model: str | Path) -> Path:
    """``runs/x/student.onnx`` -> ``runs/x/student.drive.json``."""
    return Path(model).with_suffix(SUFFIX)


def read_drive_record(model: str | Path) -> dict[str, Any] | None:
    """The drive-gains record beside ``model``; None if there is none.

    Raises ValueError (path, problem, fix) for a file that is not a JSON object.
    """
    return read_json_object(drive_path(model), 'run the self-check again (ros2 service call '
                            '/policy_node/self_check std_srvs/srv/Trigger)')
