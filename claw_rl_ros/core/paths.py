"""Where the package's data (config/, urdf/, launch/) lives: source tree or install prefix."""

from __future__ import annotations

import os
from pathlib import Path
import sys

PACKAGE = 'claw_rl_ros'


def share_dir() -> Path:
    """The folder holding config/ and urdf/.

    Order: ``CLAW_RL_SHARE_DIR``; the source checkout this module was imported from; the
    ament index (``AMENT_PREFIX_PATH``); the interpreter's prefix (a pip install into a venv).
    """
    env = os.environ.get('CLAW_RL_SHARE_DIR')
    if env:
        return Path(env)
    source_root = Path(__file__).resolve().parents[2]
    if (source_root / 'package.xml').is_file() and (source_root / 'urdf').is_dir():
        return source_root
    try:
        from ament_index_python.packages import get_package_share_directory
        return Path(get_package_share_directory(PACKAGE))
    except Exception:  # noqa: BLE001 - not installed in an ament prefix: try the next place
        pass
    prefix_share = Path(sys.prefix) / 'share' / PACKAGE
    if prefix_share.is_dir():
        return prefix_share
    raise FileNotFoundError(
        f'cannot find the {PACKAGE} data folder (config/, urdf/): set CLAW_RL_SHARE_DIR, or '
        f'add the install prefix to AMENT_PREFIX_PATH')


def resolve(path: str | Path) -> Path:
    """An absolute path; relative paths are taken from the CWD if they exist, else share_dir()."""
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path.resolve()
    return share_dir() / path


def config_path(name: str) -> Path:
    """A file in config/ by name (``robots/claw_quadruped.yaml``) or an explicit path."""
    candidate = Path(name)
    if candidate.exists() or candidate.is_absolute():
        return candidate
    return share_dir() / 'config' / name
