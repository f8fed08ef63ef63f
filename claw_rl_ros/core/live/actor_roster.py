"""Which actors the live trainer hears from, and what it says when one goes quiet or comes back.

An actor on another host is cut off by a link that drops, a host that dies or a switch that
reboots; the trainer cannot tell these apart and does not need to: a batch that times out
learns from the chunks it has (``batch_timeout_s``). What the operator needs is the truth about
it, once per event rather than once per iteration:

- ``joined``: the first accepted chunk of an actor id (INFO);
- ``silent``: a batch timed out without a chunk of an actor that had sent before, and its
  last chunk is over ``batch_timeout_s`` old (WARN, once until it is heard again);
- ``back``: a silent actor's chunk is accepted again (INFO, with how long it was silent and
  where that chunk's time went, :class:`ChunkTiming`: an actor that waited for a model, one
  whose collection stalled, or a chunk that took long from the actor to here).

Only chunks that count towards a batch (``min_chunk_envs`` worlds) are tracked: the 1-world
control-loop actor never holds a batch up, so its silence is no event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

INFO, WARN = 'info', 'warn'


@dataclass(frozen=True)
class ChunkTiming:
    """Where an actor's time went before one chunk, from the ``timing/*`` stats a
    :class:`~.batched_actor.BatchedActor` puts in it, and the chunk's age on acceptance [s].

    ``age_s`` is the trainer's wall clock minus the actor's at the collection's end: the
    encoding, the link and the trainer's queue; across hosts it holds only as well as their
    clocks agree."""

    idle_s: float
    previous_collect_s: float
    collect_s: float
    age_s: float

    KEYS = ('idle_s', 'previous_collect_s', 'collect_s', 'collected_unix')

    @classmethod
    def stats(cls, idle_s: float, previous_collect_s: float, collect_s: float,
              collected_unix: float) -> dict[str, float]:
        """The ``timing/*`` entries an actor puts in a chunk's stats (what :meth:`of` reads)."""
        return {f'timing/{k}': float(v) for k, v in zip(cls.KEYS, (
            idle_s, previous_collect_s, collect_s, collected_unix))}

    @classmethod
    def of(cls, stats: Mapping[str, float], now_unix: float) -> ChunkTiming | None:
        """The timing of a chunk with these stats accepted at ``now_unix``; None for a chunk
        without them (another actor's, or an older one's)."""
        if not all(f'timing/{k}' in stats for k in cls.KEYS):
            return None
        idle, previous, collect, collected = (float(stats[f'timing/{k}']) for k in cls.KEYS)
        return cls(idle, previous, collect, now_unix - collected)

    def describe(self) -> str:
        return (f'before it the actor idled {self.idle_s:.1f} s (waiting for a model, '
                f'publishing), collected it in {self.collect_s:.1f} s (the one before in '
                f'{self.previous_collect_s:.1f} s), and it was accepted {self.age_s:.1f} s after '
                'its collection ended')


@dataclass
class ActorRecord:
    """One actor id: chunks accepted, when last, and whether it is reported silent."""

    chunks: int = 0
    last_s: float = 0.0
    silent_since: float | None = None  # stamp of its last chunk when reported silent
    silences: int = 0


@dataclass
class ActorRoster:
    """See the module docstring; ``clock`` gives seconds (monotonic)."""

    batch_timeout_s: float
    clock: Callable[[], float]
    actors: dict[str, ActorRecord] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)  # (level, text), undrained

    def accepted(self, actor_id: str, timing: ChunkTiming | None = None) -> None:
        """A chunk of ``actor_id`` that counts towards a batch was accepted (``timing``: where
        its time went, said when it ends a silence)."""
        now = self.clock()
        record = self.actors.get(actor_id)
        if record is None:
            record = self.actors[actor_id] = ActorRecord()
            self.events.append((INFO, f'{actor_id} joined: first chunk accepted'))
        elif record.silent_since is not None:
            where = f' ({timing.describe()})' if timing is not None else ''
            self.events.append((INFO, f'{actor_id} is back: chunk accepted after '
                                f'{now - record.silent_since:.1f} s without one{where}'))
            record.silent_since = None
        record.chunks += 1
        record.last_s = now

    def batch(self, actor_ids: Iterable[str], timed_out: bool, counted: int,
              expected: int) -> None:
        """An iteration starts on chunks of ``actor_ids``; ``timed_out``: with ``counted`` of
        ``expected`` chunks because the oldest waited ``batch_timeout_s``."""
        if not timed_out:
            return
        now, present = self.clock(), set(actor_ids)
        for actor_id, record in self.actors.items():
            quiet = now - record.last_s
            if actor_id in present or record.silent_since is not None or \
                    quiet < self.batch_timeout_s:
                continue
            record.silent_since, record.silences = record.last_s, record.silences + 1
            self.events.append((WARN, f'{actor_id} silent: no chunk for {quiet:.1f} s (a '
                                f'batch timed out after {self.batch_timeout_s:g} s with '
                                f'{counted} of {expected} chunks); learning from the others '
                                'until it is back'))

    def drain(self) -> list[tuple[str, str]]:
        """The events since the last call, oldest first."""
        out, self.events = self.events, []
        return out

    def silent(self) -> list[str]:
        return sorted(a for a, r in self.actors.items() if r.silent_since is not None)

    def summary(self) -> dict[str, dict[str, int]]:
        """Per actor id: chunks accepted and times it went silent (for summary.json)."""
        return {a: {'chunks': r.chunks, 'silences': r.silences}
                for a, r in sorted(self.actors.items())}
