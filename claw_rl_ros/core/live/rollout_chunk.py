"""Rollout chunks: the versioned binary layout actors publish and the trainer learns from.

A chunk is ``num_steps`` (T) control steps of ``num_envs`` (N) worlds acted by one actor with
one model version. It travels as the ``data`` of a ``std_msgs/UInt8MultiArray`` (layout empty):

====== ======== ==============================================================================
offset size     content
====== ======== ==============================================================================
0      4        magic ``b'CLRC'``
4      2        format version, uint16 little-endian (:data:`FORMAT_VERSION`)
6      2        reserved, 0
8      4        header length H, uint32 little-endian
12     8        body length B in bytes, uint64 little-endian
20     H        header: UTF-8 JSON object (below), space-padded so the body starts at a
                multiple of 8
20+H   B        body: float32 little-endian arrays, C order, in the order of ``fields``
====== ======== ==============================================================================

Header keys: ``model_sha`` (hex sha256 prefix of the ONNX bytes that acted), ``policy_version``
(the trainer's integer version of that model), ``actor_id``, ``seq`` (the actor's chunk
counter), ``num_steps``, ``num_envs``, ``num_actions``, ``num_final`` (K, transitions that ended
by time-out), ``num_episodes`` (E), ``obs_groups`` ({group: dim}), ``windows`` ({group: H}:
the groups that travel as frames, see below), ``has_values``, ``episode_keys``, ``stats``
({name: float}, the actor's rollout statistics; a batched actor's also
``timing/*``, :class:`~.actor_roster.ChunkTiming`) and ``fields`` ([[name, shape], ...], which
must equal :func:`field_table` of the other keys).

Body fields (float32; flags are 0.0 / 1.0):

- ``obs/<group>`` [T, N, dim] for every group (``policy``, ``policy_noise_free``,
  ``privileged``): the observations acted on;
- ``actions``, ``mu``, ``sigma`` [T, N, A]: sampled actions and the behaviour Gaussian;
- ``log_probs`` [T, N]: behaviour log-density of the actions (summed over A);
- ``values`` [T, N] (only if ``has_values``): the actor's critic; else the trainer computes them;
- ``rewards``, ``terminated``, ``truncated`` [T, N];
- ``final_obs/<group>`` [K, dim]: the observation each time-out world ended in, rows in the
  row-major order of ``np.nonzero(truncated)``; ``final_values`` [K] if ``has_values``;
- ``last_obs/<group>`` [N, dim]: the observation after the last step (GAE bootstrap);
- ``episode/<key>`` [E]: per finished episode, ``return``, ``length_s`` and ``reward/<term>``.

A group in ``windows`` (the student's memory, ``env.policy_history`` H frames of D values)
travels as ``head/<group>`` [N, (H - 1) * D] and ``frames/<group>`` [T + 1, N, D] in place of
``obs/<group>``, with ``final_obs/<group>`` [K, D] and no ``last_obs/<group>``; the decoder
rebuilds the windows (:mod:`.chunk_windows`).

:func:`decode_chunk` checks everything above against a :class:`ChunkSpec` and raises
:class:`ChunkError` whose ``cause`` is one of :data:`CAUSES`; the decoded arrays are read-only
views of the payload (no copy), but for the windows rebuilt from frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import json
import math
import struct
from typing import Any, Mapping

import numpy as np

from .chunk_windows import compact_group, expand_group, restarts, window_dims

MAGIC = b'CLRC'
FORMAT_VERSION = 2  # 2: windows travel as frames
_PREFIX = struct.Struct('<4sHHIQ')
_ALIGN = 8

TRUNCATED = 'truncated'
MALFORMED = 'malformed'
FORMAT = 'format_version'
WRONG_SIZE = 'wrong_size'
NON_FINITE = 'non_finite'
BAD_VALUE = 'bad_value'
UNKNOWN_VERSION = 'unknown_version'
STALE_VERSION = 'stale_version'
#: Every reason a chunk can be dropped for (counters are kept per cause).
CAUSES = (TRUNCATED, MALFORMED, FORMAT, WRONG_SIZE, NON_FINITE, BAD_VALUE, UNKNOWN_VERSION,
          STALE_VERSION)


class ChunkError(ValueError):
    """A chunk that must not enter a batch; ``cause`` is one of :data:`CAUSES`."""

    def __init__(self, cause: str, message: str):
        if cause not in CAUSES:
            raise ValueError(f'unknown chunk error cause {cause!r}')
        super().__init__(f'{cause}: {message}')
        self.cause = cause


@dataclass(frozen=True)
class ChunkSpec:
    """What a receiver expects: rollout length, observation group sizes, action count."""

    num_steps: int
    obs_dims: Mapping[str, int]
    num_actions: int
    max_envs: int = 1 << 16
    # {group: H} of the groups that are windows of H frames (env.policy_history > 1).
    windows: Mapping[str, int] = field(default_factory=dict)


@dataclass
class RolloutChunk:
    """One actor's rollout; array shapes as in the module docstring (float32 or bool)."""

    model_sha: str
    policy_version: int
    actor_id: str
    obs: dict[str, np.ndarray]
    actions: np.ndarray
    mu: np.ndarray
    sigma: np.ndarray
    log_probs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: dict[str, np.ndarray]
    last_obs: dict[str, np.ndarray]
    values: np.ndarray | None = None
    final_values: np.ndarray | None = None
    episodes: dict[str, np.ndarray] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)
    seq: int = 0
    # {group: H}: windows of H frames, sent as frames when they rebuild exactly.
    windows: dict[str, int] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return self.actions.shape[0]

    @property
    def num_envs(self) -> int:
        return self.actions.shape[1]

    @property
    def num_actions(self) -> int:
        return self.actions.shape[2]

    @property
    def obs_dims(self) -> dict[str, int]:
        return {k: v.shape[-1] for k, v in self.obs.items()}


def field_table(num_steps: int, num_envs: int, num_actions: int, obs_dims: Mapping[str, int],
                num_final: int, num_episodes: int, has_values: bool,
                episode_keys: list[str], windows: Mapping[str, int] | None = None
                ) -> list[tuple[str, tuple[int, ...]]]:
    """The body's (name, shape) list, in body order."""
    t, n, a, k, e = num_steps, num_envs, num_actions, num_final, num_episodes
    windows = windows or {}
    frame = window_dims(obs_dims, windows)
    table = []
    for g, d in obs_dims.items():
        table += [(f'head/{g}', (n, d - frame[g])), (f'frames/{g}', (t + 1, n, frame[g]))] \
            if g in windows else [(f'obs/{g}', (t, n, d))]
    table += [('actions', (t, n, a)), ('mu', (t, n, a)), ('sigma', (t, n, a)),
              ('log_probs', (t, n))]
    if has_values:
        table.append(('values', (t, n)))
    table += [('rewards', (t, n)), ('terminated', (t, n)), ('truncated', (t, n))]
    table += [(f'final_obs/{g}', (k, frame.get(g, d))) for g, d in obs_dims.items()]
    if has_values:
        table.append(('final_values', (k,)))
    table += [(f'last_obs/{g}', (n, d)) for g, d in obs_dims.items() if g not in windows]
    table += [(f'episode/{key}', (e,)) for key in episode_keys]
    return table


def _compact(chunk: RolloutChunk) -> dict[str, dict[str, np.ndarray]]:
    """{group: head, frames, final} of the chunk's windows that rebuild exactly."""
    if not chunk.windows:
        return {}
    restart = restarts(chunk.terminated, chunk.truncated)
    out = {}
    for g, history in chunk.windows.items():
        parts = compact_group(chunk.obs[g], chunk.last_obs[g], chunk.final_obs[g], restart,
                              chunk.truncated, history)
        if parts is not None:
            out[g] = parts
    return out


def _arrays(chunk: RolloutChunk, compact: dict[str, dict[str, np.ndarray]]
            ) -> dict[str, np.ndarray]:
    out = {f'obs/{g}': v for g, v in chunk.obs.items()}
    out.update(actions=chunk.actions, mu=chunk.mu, sigma=chunk.sigma, log_probs=chunk.log_probs,
               values=chunk.values, rewards=chunk.rewards, terminated=chunk.terminated,
               truncated=chunk.truncated, final_values=chunk.final_values)
    out.update({f'final_obs/{g}': v for g, v in chunk.final_obs.items()})
    out.update({f'last_obs/{g}': v for g, v in chunk.last_obs.items()})
    out.update({f'episode/{k}': v for k, v in chunk.episodes.items()})
    for g, parts in compact.items():
        out.update({f'head/{g}': parts['head'], f'frames/{g}': parts['frames'],
                    f'final_obs/{g}': parts['final']})
    return out


def _header(chunk: RolloutChunk, windows: dict[str, int]) -> dict[str, Any]:
    has_values = chunk.values is not None
    episode_keys = list(chunk.episodes)
    num_final = int(np.count_nonzero(chunk.truncated))
    num_episodes = len(next(iter(chunk.episodes.values()))) if chunk.episodes else 0
    obs_dims = chunk.obs_dims
    table = field_table(chunk.num_steps, chunk.num_envs, chunk.num_actions, obs_dims, num_final,
                        num_episodes, has_values, episode_keys, windows)
    return {'model_sha': chunk.model_sha, 'policy_version': int(chunk.policy_version),
            'actor_id': chunk.actor_id, 'seq': int(chunk.seq), 'num_steps': chunk.num_steps,
            'num_envs': chunk.num_envs, 'num_actions': chunk.num_actions,
            'num_final': num_final, 'num_episodes': num_episodes, 'obs_groups': obs_dims,
            'windows': windows, 'has_values': has_values, 'episode_keys': episode_keys,
            'stats': {k: float(v) for k, v in chunk.stats.items()},
            'fields': [[name, list(shape)] for name, shape in table]}


def encode_chunk(chunk: RolloutChunk) -> bytearray:
    """The chunk's payload (module docstring layout); ValueError if an array's shape is wrong."""
    compact = _compact(chunk)
    header = _header(chunk, {g: chunk.windows[g] for g in compact})
    text = json.dumps(header, separators=(',', ':')).encode()
    pad = (-(_PREFIX.size + len(text))) % _ALIGN
    text += b' ' * pad
    arrays = _arrays(chunk, compact)
    table = [(name, tuple(shape)) for name, shape in header['fields']]
    body_len = 4 * sum(math.prod(shape) for _, shape in table)
    start = _PREFIX.size + len(text)
    out = bytearray(start + body_len)
    _PREFIX.pack_into(out, 0, MAGIC, FORMAT_VERSION, 0, len(text), body_len)
    out[_PREFIX.size:start] = text
    body = np.frombuffer(out, dtype='<f4', offset=start)
    pos = 0
    # One copy per field straight into the payload (float32 conversion included).
    for name, shape in table:
        value = np.asarray(arrays[name])
        if value.shape != shape:
            raise ValueError(f'chunk field {name} has shape {value.shape}, expected {shape}')
        size = math.prod(shape)
        body[pos:pos + size].reshape(shape)[...] = value
        pos += size
    return out


_HEADER_TYPES = {'model_sha': str, 'policy_version': int, 'actor_id': str, 'seq': int,
                 'num_steps': int, 'num_envs': int, 'num_actions': int, 'num_final': int,
                 'num_episodes': int, 'obs_groups': dict, 'windows': dict, 'has_values': bool,
                 'episode_keys': list, 'stats': dict, 'fields': list}


def check_head(view: memoryview, spec: ChunkSpec | None) -> tuple[dict[str, Any], int, int]:
    """(header, body offset, body length) from a payload's prefix and header (its body need not
    follow); with ``spec``, sizes and the field table are checked too, so the body length is
    what the spec allows. ChunkError if any of it is wrong."""
    if len(view) < _PREFIX.size:
        raise ChunkError(TRUNCATED, f'payload of {len(view)} bytes is shorter than the '
                         f'{_PREFIX.size}-byte prefix')
    magic, version, _, header_len, body_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise ChunkError(MALFORMED, f'magic {bytes(magic)!r} is not {MAGIC!r}: not a chunk')
    if version != FORMAT_VERSION:
        raise ChunkError(FORMAT, f'format version {version}, this trainer reads '
                         f'{FORMAT_VERSION}; run actors and trainer from the same release')
    start = _PREFIX.size + header_len
    if len(view) < start:
        raise ChunkError(TRUNCATED, f'payload has {len(view)} bytes, its prefix announces '
                         f'{start + body_len}')
    try:
        header = json.loads(bytes(view[_PREFIX.size:start]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChunkError(MALFORMED, f'header is not JSON ({exc})') from None
    if not isinstance(header, dict):
        raise ChunkError(MALFORMED, 'header is not a JSON object')
    for key, kind in _HEADER_TYPES.items():
        value = header.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ChunkError(MALFORMED, f'header field {key} is {value!r}, expected '
                             f'{kind.__name__}')
    if spec is not None:
        _check_table(header, body_len, spec)
    return header, start, body_len


def _check_table(h: dict[str, Any], body_len: int, spec: ChunkSpec) -> None:
    _check_sizes(h, spec)
    keys = h['episode_keys']
    if not all(isinstance(k, str) for k in keys) or \
            not all(isinstance(v, (int, float)) for v in h['stats'].values()):
        raise ChunkError(MALFORMED, 'episode_keys must be strings and stats numbers')
    if h['fields'] != [[name, list(shape)] for name, shape in _table(h)]:
        raise ChunkError(MALFORMED, 'the field table does not match the header sizes')
    if body_len != 4 * sum(math.prod(shape) for _, shape in _table(h)):
        raise ChunkError(MALFORMED, f'body of {body_len} bytes does not match the field table')


def _table(h: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    return field_table(h['num_steps'], h['num_envs'], h['num_actions'], h['obs_groups'],
                       h['num_final'], h['num_episodes'], h['has_values'], h['episode_keys'],
                       h['windows'])


def _check_sizes(h: dict[str, Any], spec: ChunkSpec) -> None:
    if h['obs_groups'] != dict(spec.obs_dims):
        raise ChunkError(WRONG_SIZE, f'obs_groups {h["obs_groups"]}, the trainer expects '
                         f'{dict(spec.obs_dims)} (same robot and env on both sides?)')
    windows = h['windows']
    if windows and (windows != dict(spec.windows) or
                    not all(type(v) is int for v in windows.values())):
        raise ChunkError(WRONG_SIZE, f'windows {h["windows"]}, the trainer expects '
                         f'{dict(spec.windows) or "none"} (the same env.policy_history on both '
                         'sides?)')
    if h['num_actions'] != spec.num_actions:
        raise ChunkError(WRONG_SIZE, f'num_actions {h["num_actions"]}, expected '
                         f'{spec.num_actions}')
    if h['num_steps'] != spec.num_steps:
        raise ChunkError(WRONG_SIZE, f'num_steps {h["num_steps"]}, expected {spec.num_steps} '
                         '(runner.num_steps_per_env)')
    if not 1 <= h['num_envs'] <= spec.max_envs:
        raise ChunkError(WRONG_SIZE, f'num_envs {h["num_envs"]} outside 1..{spec.max_envs}')
    if not 0 <= h['num_final'] <= h['num_steps'] * h['num_envs'] or h['num_episodes'] < 0:
        raise ChunkError(WRONG_SIZE, f'num_final {h["num_final"]} / num_episodes '
                         f'{h["num_episodes"]} impossible for {h["num_steps"]} x '
                         f'{h["num_envs"]} transitions')


def decode_chunk(payload: Any, spec: ChunkSpec) -> RolloutChunk:
    """A validated chunk from ``payload`` (bytes-like), or ChunkError naming cause and field.

    Checks, in order: prefix (truncated / malformed / format_version), header types, sizes
    against ``spec`` (wrong_size), the field table, the payload's length, every float finite
    (non_finite), sigma > 0 and flags in {0, 1} with one time-out row per truncated flag
    (bad_value). Versions are checked by :class:`~.chunk_filter.PolicyLagFilter`.
    """
    view = memoryview(payload).cast('B')
    h, start, body_len = check_head(view, spec)
    if len(view) < start + body_len:
        raise ChunkError(TRUNCATED, f'payload has {len(view)} bytes, its prefix announces '
                         f'{start + body_len}')
    if len(view) > start + body_len:
        raise ChunkError(MALFORMED, f'payload has {len(view) - start - body_len} bytes after '
                         'the announced body')
    body = np.frombuffer(view, dtype='<f4', offset=start)
    arrays, pos = {}, 0
    for name, shape in _table(h):
        size = math.prod(shape)
        arrays[name] = body[pos:pos + size].reshape(shape)
        pos += size
    # One pass over the whole body; the offending field is searched only on failure.
    if not np.isfinite(body).all():
        bad = next(n for n, a in arrays.items() if not np.isfinite(a).all())
        raise ChunkError(NON_FINITE, f'field {bad} holds NaN or inf')
    stats = {k: float(v) for k, v in h['stats'].items()}
    if not all(math.isfinite(v) for v in stats.values()):
        raise ChunkError(NON_FINITE, f'stats {stats} hold NaN or inf')
    return _assemble(h, arrays, stats)


def _flag(arrays: dict[str, np.ndarray], name: str) -> np.ndarray:
    value = arrays[name]
    if not ((value == 0.0) | (value == 1.0)).all():
        raise ChunkError(BAD_VALUE, f'field {name} holds values other than 0 and 1')
    return value > 0.5


def _assemble(h: dict[str, Any], arrays: dict[str, np.ndarray],
              stats: dict[str, float]) -> RolloutChunk:
    if not (arrays['sigma'] > 0.0).all():
        raise ChunkError(BAD_VALUE, 'field sigma holds values <= 0')
    terminated, truncated = _flag(arrays, 'terminated'), _flag(arrays, 'truncated')
    if int(np.count_nonzero(truncated)) != h['num_final']:
        raise ChunkError(BAD_VALUE, f'{np.count_nonzero(truncated)} truncated flags but '
                         f'num_final is {h["num_final"]}')
    groups = list(h['obs_groups'])
    restart = restarts(terminated, truncated)
    for g, history in h['windows'].items():
        # Windows sent as frames: rebuilt with the chunk's own episode ends.
        arrays[f'obs/{g}'], arrays[f'last_obs/{g}'], arrays[f'final_obs/{g}'] = expand_group(
            arrays[f'head/{g}'], arrays[f'frames/{g}'], arrays[f'final_obs/{g}'], restart,
            truncated, history)
    return RolloutChunk(
        model_sha=h['model_sha'], policy_version=h['policy_version'], actor_id=h['actor_id'],
        seq=h['seq'], obs={g: arrays[f'obs/{g}'] for g in groups}, actions=arrays['actions'],
        mu=arrays['mu'], sigma=arrays['sigma'], log_probs=arrays['log_probs'],
        values=arrays.get('values'), rewards=arrays['rewards'], terminated=terminated,
        truncated=truncated, final_obs={g: arrays[f'final_obs/{g}'] for g in groups},
        final_values=arrays.get('final_values'),
        last_obs={g: arrays[f'last_obs/{g}'] for g in groups},
        episodes={k: arrays[f'episode/{k}'] for k in h['episode_keys']}, stats=stats,
        windows=dict(h['windows']))


# ------------------------------------------------------------------ building chunks (actors)
def stack_rows(parts: list[np.ndarray], dim: int) -> np.ndarray:
    """[K, dim] float32 rows of ``parts`` ([k_i, dim] each), or [0, dim] without any."""
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros((0, dim), np.float32)
