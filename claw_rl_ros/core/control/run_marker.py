"""Did this node's previous process die? A marker file that only a clean stop removes.

A policy node that crashed and was respawned must not pretend nothing happened: while no policy
node ran, the robot's controller held the last target. :class:`RunMarker` writes
``<dir>/<node>.running`` (the process id) at start-up and removes it at a clean stop; finding
one at start-up whose process is gone means the previous process ended without a clean stop.
No ROS imports.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_marker_dir() -> Path:
    """``$ROS_HOME/claw_rl_ros/run`` (``~/.ros`` when ROS_HOME is unset), as ROS keeps logs."""
    home = os.environ.get('ROS_HOME') or os.path.join(os.path.expanduser('~'), '.ros')
    return Path(home) / 'claw_rl_ros' / 'run'


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunMarker:
    """``claim()`` at start-up, ``release()`` at a clean stop, for one node name."""

    def __init__(self, node_name: str, directory: str | Path | None = None):
        safe = node_name.strip('/').replace('/', '__') or 'node'
        self.path = Path(directory or default_marker_dir()) / f'{safe}.running'

    def claim(self) -> str | None:
        """Write this process's marker; returns why the previous run counts as a crash (its
        marker was left behind by a process that is gone), or None."""
        previous = None
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            text = None
        except OSError as exc:
            text = f'unreadable ({exc.strerror})'
        if text is not None:
            pid = int(text) if text.isdigit() else None
            if pid is None or (pid != os.getpid() and not _alive(pid)):
                previous = (f'the previous process (pid {text}) ended without a clean stop '
                            f'(marker {self.path}); the controller held its last target '
                            'while no policy node ran')
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f'.{os.getpid()}.tmp')
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, self.path)
        return previous

    def release(self) -> None:
        """A clean stop: remove the marker (if it is still this process's)."""
        try:
            if self.path.read_text().strip() == str(os.getpid()):
                self.path.unlink()
        except OSError:
            pass
