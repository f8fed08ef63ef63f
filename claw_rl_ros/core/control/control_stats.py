"""Timing statistics of a control loop (latency percentiles, rates, missed ticks) and counters.

Plain Python, fed with times in seconds by the nodes; ``summary()`` methods return flat dicts
that the nodes copy into ``/diagnostics`` key/value pairs.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

import numpy as np


class LatencyStats:
    """Sliding window of latencies [s]; p50/p99/max in milliseconds."""

    def __init__(self, window: int = 3000):
        self._samples: deque[float] = deque(maxlen=window)
        self.count = 0

    def add(self, seconds: float) -> None:
        self._samples.append(seconds)
        self.count += 1

    def summary(self, prefix: str) -> dict[str, float]:
        """``{prefix}_p50_ms``, ``_p99_ms``, ``_max_ms`` over the window (nan when empty)."""
        if not self._samples:
            nan = float('nan')
            return {f'{prefix}_p50_ms': nan, f'{prefix}_p99_ms': nan, f'{prefix}_max_ms': nan}
        ms = np.asarray(self._samples) * 1e3
        p50, p99 = np.percentile(ms, [50, 99])
        return {f'{prefix}_p50_ms': float(p50), f'{prefix}_p99_ms': float(p99),
                f'{prefix}_max_ms': float(ms.max())}


class RateMeter:
    """Events per second over the last ``window`` seconds (times from one monotonic clock)."""

    def __init__(self, window: float = 2.0):
        self.window = window
        self._times: deque[float] = deque()
        self.count = 0

    def tick(self, now: float) -> None:
        self._times.append(now)
        self.count += 1
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._times and self._times[0] < now - self.window:
            self._times.popleft()

    def rate(self, now: float) -> float:
        """Events per second in the window ending at ``now`` (0 with fewer than two events)."""
        self._trim(now)
        if len(self._times) < 2:
            return 0.0
        span = self._times[-1] - self._times[0]
        return (len(self._times) - 1) / span if span > 0 else 0.0


class TickMonitor:
    """Counts control ticks a periodic callback missed: gaps longer than 1.5 periods."""

    def __init__(self, period: float):
        self.period = period
        self.last: float | None = None
        self.missed = 0
        self.ticks = 0

    def tick(self, now: float) -> int:
        """Record a callback at ``now``; returns the ticks missed since the previous one."""
        missed = 0
        if self.last is not None:
            gap = now - self.last
            if gap > 1.5 * self.period:
                missed = int(round(gap / self.period)) - 1
        self.last = now
        self.missed += missed
        self.ticks += 1
        return missed

    def reset(self) -> None:
        """Forget the previous tick (after a pause, the gap is not a miss)."""
        self.last = None


class StallDeadline:
    """A wait's deadline that moves on with progress: expired only after ``timeout_s`` [s]
    in which the watched value (e.g. the newest sim time) did not change. A slow graph on a
    loaded machine gets as long as it keeps moving; a stalled one fails after ``timeout_s``."""

    def __init__(self, timeout_s: float, now: float):
        self.timeout_s = timeout_s
        self._value: object = None
        self._since = now

    def expired(self, value: object, now: float) -> bool:
        """True when ``value`` has not changed for ``timeout_s`` up to ``now``."""
        if value != self._value:
            self._value, self._since = value, now
        return now - self._since > self.timeout_s


class Counters:
    """Named integer counters with a fixed key set (every key shows up, also at 0)."""

    def __init__(self, keys: Iterable[str]):
        self._counts = {k: 0 for k in keys}

    def add(self, key: str, n: int = 1) -> None:
        self._counts[key] += n

    def __getitem__(self, key: str) -> int:
        return self._counts[key]

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def summary(self, prefix: str) -> dict[str, int]:
        """``{prefix}_{key}`` for every key, plus ``{prefix}_total``."""
        out = {f'{prefix}_{k}': v for k, v in self._counts.items()}
        out[f'{prefix}_total'] = self.total
        return out

    def to_dict(self) -> dict[str, int]:
        """{key: count} (a copy): also the checkpoint form."""
        return dict(self._counts)

    def load_dict(self, counts: dict[str, int]) -> None:
        """Continue from :meth:`to_dict` counts; keys it lacks stay 0, unknown keys are
        ignored (a cause added or retired since they were saved)."""
        for key in self._counts:
            self._counts[key] = int(counts.get(key, 0))
