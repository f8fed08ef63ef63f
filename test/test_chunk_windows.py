"""A student's memory travels as frames: an actor's chunk carries each step's newest frame and
the trainer rebuilds the windows, equal bit for bit to those the actor acted on, through resets
and time-outs; windows that would not rebuild travel whole; a trainer refuses windows of another
length by name."""

import copy
import dataclasses
import struct

import numpy as np
import pytest

from claw_rl_ros.core.live import chunk_windows as cw
from claw_rl_ros.core.live.batched_actor import BatchedActor
from claw_rl_ros.core.live.chunk_encoding import encode, expand, round_observations
from claw_rl_ros.core.live.chunk_learner import ChunkLearner
from claw_rl_ros.core.live.rollout_chunk import (ChunkError, ChunkSpec, check_head, decode_chunk,
                                                 encode_chunk)
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.observations import ObservationHistory
from test_rollout_chunk import assert_same
from test_training import tiny_config

H = 5
# Short episodes and a high fall line: time-outs and falls within each 8-step chunk.
FALLS = {'env': {'episode_length_s': 0.1, 'policy_history': H,
                 'termination': {'min_base_height': 0.25}}}


@pytest.mark.parametrize('seed', range(4))
def test_windows_rebuild_as_the_observation_history_keeps_them(seed):
    """Frames pushed into an ObservationHistory with random episode ends: the windows rebuilt
    from the head, the newest frames and the ends are the history's, slot for slot."""
    rng = np.random.default_rng(seed)
    steps, num, dim = 12, 6, 3
    history = ObservationHistory(num, H, dim)
    history.restart(rng.normal(size=(num, dim)))
    for _ in range(3):  # a window already moving when the chunk starts
        history.push(rng.normal(size=(num, dim)))
    done = rng.random((steps, num)) < 0.25
    done[0, 0] = done[steps - 1, 1] = True  # an end at the first and at the last step
    windows = [history.flat()]
    for t in range(steps):
        ended = np.flatnonzero(done[t])
        windows.append(history.push(rng.normal(size=(num, dim)).astype(np.float32),
                                    ended if ended.size else None))
    windows = np.stack(windows)  # [steps + 1, N, H * dim]: obs of each step, then last_obs
    restart = cw.restarts(done, np.zeros_like(done))
    rebuilt = cw.rebuild_windows(windows[0, :, :-dim], windows[:, :, -dim:], restart, H)
    np.testing.assert_array_equal(rebuilt, windows)
    # A world that restarts holds one frame repeated over its whole window.
    t, n = np.argwhere(restart)[0]
    np.testing.assert_array_equal(rebuilt[t, n].reshape(H, dim),
                                  np.repeat(rebuilt[t, n, -dim:][None], H, axis=0))


def actor_chunk(seed=0):
    cfg = tiny_config(**FALLS)
    cfg.env.seed = seed
    env = VecLocomotionEnv(copy.deepcopy(cfg.env))
    learner = ChunkLearner(cfg, env.obs_dims, env.num_actions)
    actor = BatchedActor(env, copy.deepcopy(learner.policy), cfg.runner.num_steps_per_env,
                         seed=seed)
    actor.load_policy(learner.policy.state_dict(), 0, 'sha0')
    chunks = [actor.collect() for _ in range(3)]
    env.close()
    return learner.spec, chunks


def test_an_actor_chunk_with_memory_travels_as_frames_and_decodes_bit_for_bit():
    spec, chunks = actor_chunk()
    assert spec.windows == {'policy': H}
    assert sum(int(c.truncated.sum()) for c in chunks) >= 3
    assert sum(int(c.terminated.sum()) for c in chunks) >= 3
    for chunk in chunks:
        assert chunk.windows == {'policy': H}
        payload = encode_chunk(chunk)
        header = check_head(memoryview(payload), spec)[0]
        assert header['windows'] == {'policy': H}
        whole = encode_chunk(dataclasses.replace(chunk, windows={}))
        # One frame of 47 floats a step instead of H: H - 1 frames fewer for every step's
        # window and every time-out's final window (the head replaces the last window's).
        body, whole_body = (check_head(memoryview(p), spec)[2] for p in (payload, whole))
        steps, worlds = chunk.truncated.shape
        saved = 4 * 47 * (H - 1) * (steps * worlds + int(chunk.truncated.sum()))
        assert whole_body - body == saved
        decoded = decode_chunk(payload, spec)
        assert_same(decoded, chunk)
        assert_same(decode_chunk(whole, spec), chunk)
        # Float16 observations on a slow link: the rebuilt windows are the rounded ones.
        rounded = decode_chunk(expand(encode(chunk, 'zstd_f16'), spec), spec)
        assert_same(rounded, round_observations(chunk))


def test_windows_that_would_not_rebuild_travel_whole():
    spec, chunks = actor_chunk(seed=1)
    chunk = chunks[0]
    # An older frame of one window that is not the frame the step before sent.
    chunk.obs['policy'][3, 2, 0] += 1.0
    payload = encode_chunk(chunk)
    assert check_head(memoryview(payload), spec)[0]['windows'] == {}
    assert_same(decode_chunk(payload, spec), chunk)
    # The same for a final observation that is not its window moved on by one frame.
    chunk = chunks[1]
    assert len(chunk.final_obs['policy'])
    chunk.final_obs['policy'][0, 0] += 1.0
    assert check_head(memoryview(encode_chunk(chunk)), spec)[0]['windows'] == {}
    assert_same(decode_chunk(encode_chunk(chunk), spec), chunk)


def test_a_trainer_refuses_windows_of_another_length_by_name():
    spec, chunks = actor_chunk()
    payload = encode_chunk(chunks[0])
    for other in (ChunkSpec(spec.num_steps, spec.obs_dims, spec.num_actions),
                  ChunkSpec(spec.num_steps, spec.obs_dims, spec.num_actions,
                            windows={'policy': 2})):
        with pytest.raises(ChunkError, match=r"wrong_size: windows \{'policy': 5\}, the "
                                             r'trainer expects .*env.policy_history'):
            decode_chunk(payload, other)


@pytest.mark.parametrize('lie', ['5.0', 'true', '"5"', '4', '[5]'])
def test_a_header_that_lies_about_its_windows_is_refused_not_crashed_on(lie):
    """A window length the spec does not name, or that only compares equal to it (5.0), is
    refused before any array is cut from the body."""
    spec, chunks = actor_chunk()
    payload = encode_chunk(chunks[0])
    magic, version, reserved, header_len, body_len = struct.unpack_from('<4sHHIQ', payload)
    text = payload[20:20 + header_len].decode().rstrip()
    lying = text.replace('"windows":{"policy":5}', '"windows":{"policy":' + lie + '}')
    assert lying != text
    # The same payload around the lying header, padded again so the body stays aligned.
    lying += ' ' * (-(20 + len(lying)) % 8)
    payload = struct.pack('<4sHHIQ', magic, version, reserved, len(lying), body_len) + \
        lying.encode() + payload[20 + header_len:]
    with pytest.raises(ChunkError, match=r'wrong_size: windows'):
        decode_chunk(bytes(payload), spec)
