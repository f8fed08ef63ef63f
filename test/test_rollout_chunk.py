"""Rollout chunks: the layout round-trips exactly, and every bad chunk is refused with its cause
(and counted) before it can reach a batch; the lag filter keeps only recent model versions."""

import json
import struct

import numpy as np
import pytest

from claw_rl_ros.core.live import rollout_chunk as rc
from claw_rl_ros.core.live.chunk_filter import ChunkGate, PolicyLagFilter
from claw_rl_ros.core.live.rollout_chunk import (ChunkError, ChunkSpec, decode_chunk,
                                                 encode_chunk, RolloutChunk)

DIMS = {'policy': 5, 'policy_noise_free': 5, 'privileged': 3}
T, N, A = 4, 3, 2
SPEC = ChunkSpec(num_steps=T, obs_dims=DIMS, num_actions=A)
SHA = 'ab12cd34ef56'


def make_chunk(seed=0, values=True, version=1, sha=SHA) -> RolloutChunk:
    rng = np.random.default_rng(seed)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    truncated = np.zeros((T, N), bool)
    truncated[1, 2] = truncated[3, 0] = True
    terminated = np.zeros((T, N), bool)
    terminated[2, 1] = True
    k = int(truncated.sum())
    return RolloutChunk(
        model_sha=sha, policy_version=version, actor_id='/ns1/actor_0', seq=7,
        obs={g: r(T, N, d) for g, d in DIMS.items()}, actions=r(T, N, A), mu=r(T, N, A),
        sigma=np.abs(r(T, N, A)) + 0.1, log_probs=r(T, N), rewards=r(T, N),
        terminated=terminated, truncated=truncated,
        final_obs={g: r(k, d) for g, d in DIMS.items()},
        last_obs={g: r(N, d) for g, d in DIMS.items()},
        values=r(T, N) if values else None, final_values=r(k) if values else None,
        episodes={'return': r(3), 'length_s': np.abs(r(3)), 'reward/tracking_lin_vel': r(3)},
        stats={'diverged': 0.0, 'tracking_error/lin_vel_x': 0.25})


def assert_same(a: RolloutChunk, b: RolloutChunk) -> None:
    for name in ('model_sha', 'policy_version', 'actor_id', 'seq', 'stats'):
        assert getattr(a, name) == getattr(b, name), name
    for name in ('actions', 'mu', 'sigma', 'log_probs', 'rewards', 'terminated', 'truncated',
                 'values', 'final_values'):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_array_equal(x, y, err_msg=name)
    for name in ('obs', 'final_obs', 'last_obs', 'episodes'):
        x, y = getattr(a, name), getattr(b, name)
        assert list(x) == list(y), name
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=f'{name}/{key}')


@pytest.mark.parametrize('values', [True, False])
def test_round_trip_is_exact(values):
    chunk = make_chunk(values=values)
    payload = encode_chunk(chunk)
    back = decode_chunk(bytes(payload), SPEC)
    assert_same(chunk, back)
    assert back.terminated.dtype == bool and back.truncated[1, 2] and back.terminated[2, 1]
    assert back.num_envs == N and back.obs_dims == DIMS
    # The layout is what the docstring says: prefix, JSON header, 8-byte-aligned float32 body.
    magic, fmt, _, header_len, body_len = struct.unpack_from('<4sHHIQ', payload)
    assert (magic, fmt) == (b'CLRC', rc.FORMAT_VERSION)
    assert (20 + header_len) % 8 == 0 and len(payload) == 20 + header_len + body_len
    header = json.loads(payload[20:20 + header_len])
    assert header['fields'][0] == ['obs/policy', [T, N, 5]]
    first = np.frombuffer(payload, '<f4', count=T * N * 5, offset=20 + header_len)
    np.testing.assert_array_equal(first.reshape(T, N, 5), chunk.obs['policy'])


def test_a_chunk_without_time_outs_or_episodes_round_trips():
    chunk = make_chunk()
    chunk.truncated[:] = False
    chunk.final_obs = {g: np.zeros((0, d), np.float32) for g, d in DIMS.items()}
    chunk.final_values = np.zeros(0, np.float32)
    chunk.episodes = {}
    assert_same(chunk, decode_chunk(encode_chunk(chunk), SPEC))


def test_encoding_refuses_an_array_of_the_wrong_shape():
    chunk = make_chunk()
    chunk.rewards = chunk.rewards[:, :2]
    with pytest.raises(ValueError, match='rewards has shape'):
        encode_chunk(chunk)


def expect(cause, payload, spec=SPEC, match=None):
    with pytest.raises(ChunkError, match=match) as info:
        decode_chunk(payload, spec)
    assert info.value.cause == cause
    return info.value


def corrupt(field_name, value, index=(0,)):
    """A valid payload with one body element of ``field_name`` overwritten."""
    chunk = make_chunk()
    target = getattr(chunk, field_name) if '/' not in field_name else \
        getattr(chunk, field_name.split('/')[0])[field_name.split('/')[1]]
    target = target.astype(np.float32) if target.dtype == bool else target
    target[index] = value
    if '/' in field_name:
        getattr(chunk, field_name.split('/')[0])[field_name.split('/')[1]] = target
    else:
        setattr(chunk, field_name, target)
    return encode_chunk(chunk)


@pytest.mark.parametrize('field_name', ['obs/privileged', 'actions', 'rewards', 'values',
                                        'final_obs/policy', 'last_obs/policy_noise_free',
                                        'episodes/return'])
@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused_naming_the_field(field_name, bad):
    index = (0,) if field_name.startswith('episodes') or field_name.startswith('final') \
        else (0, 0)
    shown = field_name.replace('episodes/', 'episode/')
    expect(rc.NON_FINITE, corrupt(field_name, bad, index), match=f'field {shown} ')


def test_bad_flags_and_sigma_are_refused():
    expect(rc.BAD_VALUE, corrupt('terminated', 0.5, (0, 0)), match='terminated')
    expect(rc.BAD_VALUE, corrupt('sigma', 0.0, (0, 0, 0)), match='sigma')
    # A truncated flag without its final observation row (patched into a valid payload).
    payload = encode_chunk(make_chunk())
    header_len = struct.unpack_from('<I', payload, 8)[0]
    pos = 20 + header_len
    for name, shape in json.loads(payload[20:20 + header_len])['fields']:
        if name == 'truncated':
            break
        pos += 4 * int(np.prod(shape))
    struct.pack_into('<f', payload, pos, 1.0)
    expect(rc.BAD_VALUE, bytes(payload), match='num_final')


@pytest.mark.parametrize('spec, match', [
    (ChunkSpec(T, {**DIMS, 'privileged': 4}, A), 'obs_groups'),
    (ChunkSpec(T, {'policy': 5, 'privileged': 3}, A), 'obs_groups'),
    (ChunkSpec(T, DIMS, A + 1), 'num_actions'),
    (ChunkSpec(T + 1, DIMS, A), 'num_steps_per_env'),
    (ChunkSpec(T, DIMS, A, max_envs=2), 'num_envs 3'),
])
def test_wrong_sizes_are_refused(spec, match):
    expect(rc.WRONG_SIZE, encode_chunk(make_chunk()), spec, match)


@pytest.mark.parametrize('cut', [0, 10, 200, 1])
def test_truncated_payloads_are_refused(cut):
    payload = bytes(encode_chunk(make_chunk()))
    cut_payload = payload[:cut] if cut != 1 else payload[:-1]
    expect(rc.TRUNCATED, cut_payload)


def test_malformed_and_foreign_payloads_are_refused():
    payload = bytearray(encode_chunk(make_chunk()))
    expect(rc.MALFORMED, b'XXXX' + bytes(payload[4:]), match='magic')
    expect(rc.MALFORMED, bytes(payload) + b'\0\0\0\0', match='after the announced body')
    future = bytearray(payload)
    struct.pack_into('<H', future, 4, rc.FORMAT_VERSION + 1)
    expect(rc.FORMAT, bytes(future), match='format version')
    # A header that lies about its sizes (same byte length): the field table disagrees.
    header_len = struct.unpack_from('<I', payload, 8)[0]
    text = payload[20:20 + header_len].decode()
    lying = text.replace('"num_episodes":3', '"num_episodes":2')
    assert lying != text
    payload[20:20 + header_len] = lying.encode()
    expect(rc.MALFORMED, bytes(payload), match='field table')
    broken = bytearray(encode_chunk(make_chunk()))
    broken[20] = ord('[')
    expect(rc.MALFORMED, bytes(broken))


def test_lag_filter_keeps_the_current_version_and_up_to_max_lag():
    strict = PolicyLagFilter()
    with pytest.raises(ChunkError, match='published no model') as info:
        strict.check(0, SHA)
    assert info.value.cause == rc.UNKNOWN_VERSION
    strict.publish(0, 'aaaaaaaaaaaa')
    strict.publish(1, SHA)
    strict.check(1, SHA)
    for version, sha, cause in ((0, 'aaaaaaaaaaaa', rc.STALE_VERSION),
                                (2, SHA, rc.UNKNOWN_VERSION),
                                (1, 'ffffffffffff', rc.UNKNOWN_VERSION),
                                (1, '', rc.UNKNOWN_VERSION)):
        with pytest.raises(ChunkError) as info:
            strict.check(version, sha)
        assert info.value.cause == cause, (version, sha)
    lagging = PolicyLagFilter(max_policy_lag=1)
    for version in range(4):
        lagging.publish(version, f'{version:012d}')
    lagging.check(3, '000000000003')
    lagging.check(2, '000000000002')
    with pytest.raises(ChunkError, match='2 behind'):
        lagging.check(1, '000000000001')
    with pytest.raises(ValueError, match='not newer'):
        lagging.publish(3, 'x')
    with pytest.raises(ValueError, match='max_policy_lag'):
        PolicyLagFilter(-1)


def test_gate_counts_every_drop_by_cause_and_accepts_good_chunks():
    lag = PolicyLagFilter()
    lag.publish(1, SHA)
    gate = ChunkGate(SPEC, lag)
    good = encode_chunk(make_chunk())
    assert gate.admit(good).actor_id == '/ns1/actor_0'
    bad = {rc.NON_FINITE: corrupt('rewards', np.nan, (0, 0)),
           rc.TRUNCATED: bytes(good)[:-8],
           rc.STALE_VERSION: encode_chunk(make_chunk(version=0)),
           rc.UNKNOWN_VERSION: encode_chunk(make_chunk(sha='0123456789ab'))}
    for cause, payload in bad.items():
        chunk, error = gate.admit_or_none(payload)
        assert chunk is None and error.cause == cause
    counts = gate.counters.as_dict()
    assert counts['accepted'] == 1
    assert counts['dropped_fraction'] == pytest.approx(4 / 5)
    for cause in rc.CAUSES:
        assert counts[f'dropped/{cause}'] == (1 if cause in bad else 0), cause
