"""Chunk encodings for slow links: zstd is lossless (the trainer rebuilds the exact payload),
zstd_f16 rounds only observations, and a bad or hostile envelope is refused with its cause
before anything is inflated past what the spec allows."""

import struct
import tracemalloc

import numpy as np
import pytest
import zstandard

from claw_rl_ros.core.live import chunk_encoding as ce
from claw_rl_ros.core.live import rollout_chunk as rc
from claw_rl_ros.core.live.chunk_filter import ChunkGate, PolicyLagFilter
from claw_rl_ros.core.live.rollout_chunk import ChunkError, decode_chunk, encode_chunk
from test_rollout_chunk import assert_same, make_chunk, SHA, SPEC


def smooth_chunk(seed=0):
    """A chunk whose observations are smooth in time (as a robot's are): compressible."""
    chunk = make_chunk(seed)
    t = np.linspace(0, 1, chunk.num_steps, dtype=np.float32)[:, None, None]
    chunk.obs = {g: (np.sin(3 * t + v[:1]) * 0.7).astype(np.float32)
                 for g, v in chunk.obs.items()}
    return chunk


def inflate(payload):
    return decode_chunk(ce.expand(payload, SPEC), SPEC)


def test_zstd_rebuilds_the_exact_payload_so_learning_is_bit_identical():
    chunk = make_chunk()
    raw = encode_chunk(chunk)
    packed = ce.encode(chunk, 'zstd')
    assert bytes(packed[:4]) == b'CLRZ'
    assert bytes(ce.expand(packed, SPEC)) == bytes(raw)
    assert_same(inflate(packed), chunk)
    assert ce.encode(chunk, 'raw') == raw and ce.expand(raw, SPEC) is raw


def test_zstd_shrinks_a_compressible_chunk_and_f16_shrinks_it_more():
    chunk = smooth_chunk()
    sizes = {e: len(ce.encode(chunk, e)) for e in ce.ENCODINGS}
    assert sizes['zstd'] < sizes['raw'] and sizes['zstd_f16'] < sizes['zstd'], sizes


def test_f16_rounds_observations_only_and_within_float16_precision():
    chunk = make_chunk()
    chunk.obs['policy'][0, 0, :3] = [70000.0, -1e6, 3.0]  # over float16's range: kept
    out = inflate(ce.encode(chunk, 'zstd_f16'))
    for name in ('obs', 'final_obs', 'last_obs'):
        for group, sent in getattr(chunk, name).items():
            got = getattr(out, name)[group]
            np.testing.assert_allclose(got, sent, rtol=2 ** -11, atol=0, err_msg=group)
            if (name, group) != ('obs', 'policy'):
                np.testing.assert_array_equal(got, sent.astype(np.float16).astype(np.float32))
    assert not np.array_equal(out.obs['privileged'], chunk.obs['privileged'])  # really rounded
    np.testing.assert_array_equal(out.obs['policy'][0, 0, :3], [70000.0, -1e6, 3.0])
    for name in ('actions', 'mu', 'sigma', 'log_probs', 'rewards', 'values', 'final_values'):
        np.testing.assert_array_equal(getattr(out, name), getattr(chunk, name), err_msg=name)


@pytest.mark.parametrize('bad', [np.nan, np.inf])
def test_f16_keeps_a_non_finite_observation_so_the_trainer_drops_it(bad):
    chunk = make_chunk()
    chunk.obs['policy'][1, 1, 1] = bad
    with pytest.raises(ChunkError) as info:
        inflate(ce.encode(chunk, 'zstd_f16'))
    assert info.value.cause == rc.NON_FINITE and 'obs/policy' in str(info.value)


def test_an_unknown_encoding_is_refused_by_name():
    with pytest.raises(ValueError, match="chunk_encoding 'lz4' is not one of raw, zstd"):
        ce.encode(make_chunk(), 'lz4')


def envelope(head: bytes, frame: bytes, version=1, flags=0, head_len=None) -> bytes:
    return struct.pack('<4sHHI', b'CLRZ', version, flags,
                       len(head) if head_len is None else head_len) + head + frame


def split(chunk=None):
    """(head, body) of a raw payload."""
    raw = bytes(encode_chunk(chunk or make_chunk()))
    _, start, _ = rc.check_head(memoryview(raw), SPEC)
    return raw[:start], raw[start:]


def shuffled_frame(body: bytes) -> bytes:
    planes = np.frombuffer(body, np.uint8).reshape(-1, 4).T.tobytes()
    return zstandard.ZstdCompressor().compress(planes)


def test_a_hand_made_envelope_decodes_and_its_corruptions_are_refused_by_cause():
    head, body = split()
    assert_same(inflate(envelope(head, shuffled_frame(body))), make_chunk())
    cases = {
        rc.TRUNCATED: [b'CLRZ\x01', envelope(head, b'', head_len=len(head) + 50)],
        rc.FORMAT: [envelope(head, shuffled_frame(body), version=2),
                    envelope(head, shuffled_frame(body), flags=4)],
        rc.MALFORMED: [envelope(head, b'not a zstd frame'),
                       envelope(head, shuffled_frame(body[:-8])),  # inflates short
                       envelope(head, shuffled_frame(body + b'\0' * 8)),  # inflates long
                       envelope(head + b'  ', shuffled_frame(body)),  # head length wrong
                       envelope(b'XXXX' + head[4:], shuffled_frame(body))],
        rc.WRONG_SIZE: [envelope(head.replace(b'"num_steps":4', b'"num_steps":5'),
                                 shuffled_frame(body))],
    }
    for cause, payloads in cases.items():
        for payload in payloads:
            with pytest.raises(ChunkError) as info:
                inflate(payload)
            assert info.value.cause == cause, (cause, payload[:40], info.value)


def test_a_decompression_bomb_is_refused_without_inflating_it():
    """A tiny frame that inflates to 512 MiB under a header announcing this chunk's body: the
    reader stops one byte past the announced length."""
    head, body = split()
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(len(body) * 4))
    big = zstandard.ZstdCompressor(level=1).compress(bytes(512 << 20))
    for frame in (bomb, big):
        assert len(frame) < 1 << 20
        tracemalloc.start()
        try:
            with pytest.raises(ChunkError) as info:
                inflate(envelope(head, frame))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert info.value.cause == rc.MALFORMED and 'inflates to over' in str(info.value)
        assert peak < 16 << 20, f'{peak / 2 ** 20:.0f} MiB allocated to refuse it'


def test_a_head_announcing_a_body_the_spec_does_not_allow_is_refused_before_inflating():
    head, body = split()
    huge = bytearray(head)
    struct.pack_into('<Q', huge, 12, 1 << 40)  # the prefix's body length: 1 TiB
    big = zstandard.ZstdCompressor(level=1).compress(bytes(512 << 20))
    with pytest.raises(ChunkError) as info:
        inflate(envelope(bytes(huge), big))
    assert info.value.cause == rc.MALFORMED and 'does not match the field table' in \
        str(info.value)


def test_the_gate_accepts_every_encoding_and_counts_a_bad_envelope():
    lag = PolicyLagFilter()
    lag.publish(1, SHA)
    gate = ChunkGate(SPEC, lag)
    for encoding in ce.ENCODINGS:
        assert gate.admit(ce.encode(make_chunk(), encoding)).seq == 7
    head, body = split()
    chunk, error = gate.admit_or_none(envelope(head, b'garbage'))
    assert chunk is None and error.cause == rc.MALFORMED
    assert gate.counters.as_dict()['accepted'] == 3
