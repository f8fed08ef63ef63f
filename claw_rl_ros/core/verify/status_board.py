"""What a gate hears from the graph it drives, and waiting on it (plain Python, no ROS).

The verify driver's ROS callbacks put each node's /diagnostics status, the sim's episode
record and the policy's model version here; its protocol waits on them. A wait ends when its
condition holds, fails with :class:`GraphGone` when a node process stopped, and on a stall
only: a loaded machine slows the lockstep loop down, it does not stop it.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..control.control_stats import StallDeadline


class GraphGone(RuntimeError):
    """The graph under test stopped answering (a node died or never came up)."""


POLL_S = 0.05  # re-check of conditions nobody notifies (discovery, e.g. a service's)


class StatusBoard:
    """``alive()``: whether every node process still runs; ``timeout_s``: how long a wait's
    progress may stand still."""

    def __init__(self, alive: Callable[[], bool], timeout_s: float = 60.0):
        self.alive, self.timeout_s = alive, timeout_s
        self.cond = threading.Condition()
        self.status: dict[str, dict[str, str]] = {}  # node -> its newest key/values
        self.status_seq: dict[str, int] = {}  # node -> statuses received
        self.record: Any = None  # the newest episode record
        self.records = 0
        self.version = ''  # the newest model version said

    # ---------------------------------------------------------------- from the callbacks
    def put_status(self, node: str, values: dict[str, str]) -> None:
        with self.cond:
            self.status[node] = values
            self.status_seq[node] = self.status_seq.get(node, 0) + 1
            self.cond.notify_all()

    def put_record(self, record: Any) -> None:
        with self.cond:
            self.record, self.records = record, self.records + 1
            self.cond.notify_all()

    def put_version(self, version: str) -> None:
        with self.cond:
            self.version = version
            self.cond.notify_all()

    def notify(self, _: object = None) -> None:
        """Wake the waits (e.g. a service reply arrived: a future's done callback)."""
        with self.cond:
            self.cond.notify_all()

    # ---------------------------------------------------------------------------- waits
    def wait(self, what: str, ready: Callable[[], Any],
             progress: Callable[[], Any] = lambda: None) -> Any:
        """Block until ``ready()`` (called under the lock) is truthy and return it; GraphGone
        when a node stopped, or when ``progress()`` (e.g. the sim's step count) stood still for
        timeout_s."""
        deadline = StallDeadline(self.timeout_s, time.monotonic())
        with self.cond:
            while True:
                value = ready()
                if value:
                    return value
                if not self.alive():
                    raise GraphGone(f'a node of the graph stopped while waiting for {what}')
                if deadline.expired(progress(), time.monotonic()):
                    raise GraphGone(f'no {what}: nothing moved for {self.timeout_s:g} s')
                self.cond.wait(POLL_S)

    def count(self, node: str) -> int:
        """Statuses of ``node`` received so far (to wait for one after an action)."""
        with self.cond:
            return self.status_seq.get(node, 0)

    def next_status(self, node: str, predicate: Callable[[dict], bool] = lambda v: True,
                    seq: int | None = None,
                    progress: Callable[[], Any] = lambda: None) -> dict[str, str]:
        """The key/values of a status of ``node`` satisfying ``predicate``, received after this
        call (or after its ``seq``-th status, :meth:`count` taken before an action whose status
        may come before the wait starts)."""
        if seq is None:
            seq = self.count(node)
        return self.wait(f'/diagnostics of {node}', lambda: self.status_seq.get(node, 0) > seq
                         and predicate(self.status[node]) and dict(self.status[node]), progress)
