"""What the policy controller does with the unexpected: exceptions as faults, and alerts.

Nothing that reaches the controller may crash the node: :class:`TickGuard` turns an exception
raised anywhere in a tick (input, observation, policy, shaping, publishing) into a named fault
counted by the stage it came from, and :class:`Alerts` keeps the messages the node must log
once (a clock mismatch, a restart) instead of once per message. No ROS imports.
"""

from __future__ import annotations

from .control_stats import Counters

# Where an exception was raised (counted per stage in the diagnostics: ``exceptions_<stage>``).
EXCEPTION_STAGES = ('joint_state', 'imu', 'command', 'watchdog', 'request', 'observation',
                    'policy', 'shaping', 'publish')


class Alerts:
    """Messages to log once per key (``drain`` hands the new ones to the node)."""

    def __init__(self):
        self.seen: dict[str, str] = {}
        self.pending: list[tuple[str, str]] = []

    def once(self, key: str, text: str) -> None:
        """Queue ``text`` for the log the first time ``key`` is raised (until ``clear``)."""
        if key not in self.seen:
            self.seen[key] = text
            self.pending.append((key, text))

    def clear(self, key: str) -> None:
        """``key`` is healthy again: a later occurrence is logged again."""
        self.seen.pop(key, None)

    def drain(self) -> list[tuple[str, str]]:
        """(key, text) of the alerts raised since the last call."""
        out, self.pending = self.pending, []
        return out


class TickGuard:
    """Counts exceptions by stage; ``stage`` names what the tick is doing now."""

    def __init__(self):
        self.counts = Counters(EXCEPTION_STAGES)
        self.stage = 'joint_state'
        self.last = ''

    def caught(self, exc: BaseException) -> str:
        """Count ``exc`` at the current stage; returns the fault detail naming both."""
        self.counts.add(self.stage)
        text = str(exc).strip().splitlines()
        self.last = f'{self.stage}: {type(exc).__name__}: {text[0][:200] if text else ""}'
        return self.last
