"""Smaller chunks for slow links: a zstd envelope around the rollout-chunk payload.

A 128-world x 24-step chunk of the main job is 1.9 MB of float32; at 10,000 env steps/s that is
~50 Mbit/s, more than a Wi-Fi link carries. An actor's ``chunk_encoding`` picks:

- ``raw``: the payload of :mod:`.rollout_chunk` as is (the default; no CPU spent);
- ``zstd``: the payload's body byte-shuffled (the 4 bytes of every float32 in 4 planes, so
  exponents and signs sit together) and compressed with zstd level 1; lossless: the trainer
  rebuilds the exact payload, so learning is bit-identical to ``raw``. About 0.65 of ``raw``;
- ``zstd_f16``: as ``zstd``, after rounding the observations (``obs``, ``final_obs``,
  ``last_obs``; not actions, log-probabilities, rewards or values) to float16 precision (kept as
  float32 values: the low 13 mantissa bits become 0 and compress away). About 0.4 of ``raw``.
  Not bit-identical: the trainer learns from observations within 2^-11 (relative) of those the
  actor acted on, so the first PPO epoch's ratio is not exactly 1. Magnitudes over float16's
  65504 and non-finite values are left as they are (a NaN observation is still dropped).

Envelope (little-endian):

====== ======== ==============================================================================
offset size     content
====== ======== ==============================================================================
0      4        magic ``b'CLRZ'``
4      2        envelope version (:data:`ENVELOPE_VERSION`)
6      2        flags: bit 0 observations rounded to float16 precision (``zstd_f16``)
8      4        head length L: the payload's prefix and header, verbatim
12     L        the payload's prefix and header (its body length B is in the prefix)
12+L   ...      one zstd frame of the byte-shuffled body (B bytes when decompressed)
====== ======== ==============================================================================

:func:`expand` checks the head against the receiver's :class:`~.rollout_chunk.ChunkSpec`
before it decompresses anything, and decompresses at most B + 1 bytes: a small envelope cannot
make the trainer allocate more than the spec allows (no decompression bomb).
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np
import zstandard

from ..params.node_config import CHUNK_ENCODINGS as ENCODINGS
from .rollout_chunk import (check_head, ChunkError, ChunkSpec, encode_chunk, FORMAT,
                            MALFORMED, RolloutChunk, TRUNCATED)

MAGIC = b'CLRZ'
ENVELOPE_VERSION = 1
F16_OBSERVATIONS = 1
_ENVELOPE = struct.Struct('<4sHHI')
_F16_MAX = float(np.finfo(np.float16).max)
_LEVEL = 1  # zstd level: ~6 ms per 1.9 MB chunk on one core; level 3 saves 6 % more


def check_encoding(value: str, field: str = 'chunk_encoding') -> str:
    if value not in ENCODINGS:
        raise ValueError(f'{field} {value!r} is not one of {", ".join(ENCODINGS)} (raw: as is; '
                         'zstd: lossless, ~0.65 of raw; zstd_f16: float16 observations, ~0.4)')
    return value


def round_observations(chunk: RolloutChunk) -> RolloutChunk:
    """The chunk with every observation rounded to float16 precision (see the module)."""
    def f16(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        with np.errstate(over='ignore', invalid='ignore'):
            rounded = x.astype(np.float16).astype(np.float32)
        return np.where(np.abs(x) <= _F16_MAX, rounded, x)  # big, inf and NaN: unchanged
    return dataclasses.replace(chunk, obs={g: f16(v) for g, v in chunk.obs.items()},
                               final_obs={g: f16(v) for g, v in chunk.final_obs.items()},
                               last_obs={g: f16(v) for g, v in chunk.last_obs.items()})


def _shuffle(body: memoryview) -> bytes:
    """[n floats x 4 bytes] -> [4 planes x n bytes]."""
    return np.frombuffer(body, np.uint8).reshape(-1, 4).T.tobytes()


def _unshuffle(planes: bytes) -> bytes:
    return np.frombuffer(planes, np.uint8).reshape(4, -1).T.tobytes()


def encode(chunk: RolloutChunk, encoding: str) -> bytes | bytearray:
    """The chunk's payload in ``encoding`` (one of :data:`ENCODINGS`)."""
    check_encoding(encoding)
    if encoding == 'zstd_f16':
        chunk = round_observations(chunk)
    payload = encode_chunk(chunk)
    if encoding == 'raw':
        return payload
    view = memoryview(payload)
    start = len(payload) - check_head(view, None)[2]  # the body is the payload's tail
    flags = F16_OBSERVATIONS if encoding == 'zstd_f16' else 0
    frame = zstandard.ZstdCompressor(level=_LEVEL).compress(_shuffle(view[start:]))
    return _ENVELOPE.pack(MAGIC, ENVELOPE_VERSION, flags, start) + bytes(view[:start]) + frame


def expand(payload: Any, spec: ChunkSpec) -> Any:
    """The rollout-chunk payload inside ``payload`` (returned as is when it is not an
    envelope); ChunkError (truncated / malformed / format_version) for a bad envelope."""
    view = memoryview(payload).cast('B')
    if bytes(view[:4]) != MAGIC:
        return payload
    if len(view) < _ENVELOPE.size:
        raise ChunkError(TRUNCATED, f'envelope of {len(view)} bytes is shorter than its '
                         f'{_ENVELOPE.size}-byte prefix')
    _, version, flags, head_len = _ENVELOPE.unpack_from(view, 0)
    if version != ENVELOPE_VERSION or flags & ~F16_OBSERVATIONS:
        raise ChunkError(FORMAT, f'envelope version {version} flags {flags:#x}; this trainer '
                         f'reads version {ENVELOPE_VERSION}, flags 0 or 1: run actors and '
                         'trainer from the same release')
    head = view[_ENVELOPE.size:_ENVELOPE.size + head_len]
    if len(head) < head_len:
        raise ChunkError(TRUNCATED, f'envelope announces a {head_len}-byte head, has '
                         f'{len(head)}')
    # Sizes bounded by the spec before inflating (a head longer than the payload's prefix and
    # header is refused by decode_chunk: bytes after the announced body).
    body_len = check_head(head, spec)[2]
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(
            bytes(view[_ENVELOPE.size + head_len:]))
        planes = reader.read(body_len + 1)
    except zstandard.ZstdError as exc:
        raise ChunkError(MALFORMED, f'compressed body is not a zstd frame ({exc})') from None
    if len(planes) != body_len:
        raise ChunkError(MALFORMED, f'compressed body inflates to '
                         f'{"over " if len(planes) > body_len else ""}{len(planes)} bytes, '
                         f'the header announces {body_len}')
    return bytes(head) + _unshuffle(planes)
