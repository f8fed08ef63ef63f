"""What the trainer lets into a batch: decoded, valid chunks within ``max_policy_lag`` versions.

:class:`PolicyLagFilter` knows the model versions the trainer published (integer version and
sha256 prefix); a chunk acted by a version it never published (or whose sha does not match
the published one) is ``unknown_version``, one more than ``max_policy_lag`` versions behind the
current one is ``stale_version``. :class:`ChunkGate` decodes, filters and counts every drop by
cause, so the trainer can report the dropped fraction.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .chunk_encoding import expand
from ..control.control_stats import Counters
from .rollout_chunk import (CAUSES, ChunkError, ChunkSpec, decode_chunk, RolloutChunk,
                            STALE_VERSION, UNKNOWN_VERSION)


class PolicyLagFilter:
    """Accepts chunks from the current version and up to ``max_policy_lag`` older ones."""

    def __init__(self, max_policy_lag: int = 0):
        if max_policy_lag < 0:
            raise ValueError(f'max_policy_lag {max_policy_lag} must be >= 0 (0 = only the '
                             'current model version)')
        self.max_policy_lag = max_policy_lag
        self.current: int | None = None
        self._shas: OrderedDict[int, str] = OrderedDict()

    def publish(self, version: int, sha: str) -> None:
        """``version`` (greater than the last one) with model ``sha`` is now current."""
        if self.current is not None and version <= self.current:
            raise ValueError(f'version {version} is not newer than the current {self.current}')
        self.current = version
        self._shas[version] = sha
        while len(self._shas) > self.max_policy_lag + 1:
            self._shas.popitem(last=False)

    def check(self, version: int, sha: str) -> None:
        """Nothing if a chunk acted by (version, sha) may be used; else ChunkError."""
        if self.current is None:
            raise ChunkError(UNKNOWN_VERSION, f'version {version} ({sha}): the trainer has '
                             'published no model yet')
        lag = self.current - version
        if lag > self.max_policy_lag:
            raise ChunkError(STALE_VERSION, f'version {version} is {lag} behind the current '
                             f'{self.current} (max_policy_lag {self.max_policy_lag})')
        known = self._shas.get(version)
        if known is None or not sha or not known.startswith(sha):
            raise ChunkError(UNKNOWN_VERSION, f'version {version} with model {sha!r} was not '
                             f'published by this trainer (current {self.current}: '
                             f'{self._shas.get(self.current)})')


class ChunkCounters:
    """Accepted chunks and drops per cause (every cause present, 0 until it happens)."""

    def __init__(self):
        self.accepted = 0
        self.dropped = Counters(CAUSES)

    @property
    def total_dropped(self) -> int:
        return self.dropped.total

    def dropped_fraction(self) -> float:
        """Dropped / received chunks (0 before any arrived)."""
        total = self.accepted + self.total_dropped
        return self.total_dropped / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {'accepted': self.accepted, 'dropped_fraction': self.dropped_fraction(),
                **{f'dropped/{c}': n for c, n in self.dropped.to_dict().items()}}

    def state_dict(self) -> dict[str, Any]:
        """The counts, for a checkpoint (a resumed run counts on from them)."""
        return {'accepted': self.accepted, 'dropped': self.dropped.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` counts (causes it does not have stay 0)."""
        self.accepted = int(state['accepted'])
        self.dropped.load_dict(state['dropped'])


class ChunkGate:
    """decode -> version filter -> counters; ``admit`` returns the chunk or raises ChunkError."""

    def __init__(self, spec: ChunkSpec, lag_filter: PolicyLagFilter):
        self.spec = spec
        self.lag_filter = lag_filter
        self.counters = ChunkCounters()

    def admit(self, payload: Any) -> RolloutChunk:
        """The decoded chunk if it may enter a batch; else counts and re-raises ChunkError."""
        try:
            chunk = decode_chunk(expand(payload, self.spec), self.spec)
            self.lag_filter.check(chunk.policy_version, chunk.model_sha)
        except ChunkError as exc:
            self.counters.dropped.add(exc.cause)
            raise
        self.counters.accepted += 1
        return chunk

    def admit_or_none(self, payload: Any) -> tuple[RolloutChunk | None, ChunkError | None]:
        """(chunk, None) or (None, the error): for callers that log drops and carry on."""
        try:
            return self.admit(payload), None
        except ChunkError as exc:
            return None, exc
