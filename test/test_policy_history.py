"""A student with memory (env.policy_history): the window of past observations is built the same
way by the env and by the policy node, exported in the model's spec, refused when it does not
fit, mirrored frame by frame, and trained, exported and evaluated end to end."""

import json

import numpy as np
import onnx
import pytest
import torch

from claw_rl_ros.core.config import ConfigError, from_dict
from claw_rl_ros.core.replay import action_replay as replay
from claw_rl_ros.core.evaluation.evaluator import evaluate
from claw_rl_ros.core.evaluation.final_student import export_and_evaluate
from claw_rl_ros.core.export.onnx_export import export_checkpoint, export_onnx
from claw_rl_ros.core.export.onnx_policy import ModelError, OnnxPolicy
from claw_rl_ros.core.control.policy_controller import PolicyController
from claw_rl_ros.core.control.state_input import (command_array, imu_arrays, JointOrder,
                                                  ObservationAssembler)
from claw_rl_ros.core.learning import checkpoint as ckpt
from claw_rl_ros.core.learning.networks import ActorCritic
from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.observations import ObservationHistory, POLICY, POLICY_NOISE_FREE
from claw_rl_ros.core.sim.env_config import observation_dims
from claw_rl_ros.core.sim.robot_spec import METADATA_KEY
from claw_rl_ros.core.sim.symmetry import env_group_mirrors
from claw_rl_ros.core.sim.training_session import TrainingSession
from claw_rl_ros.launch_graph import GRAPHS, resolve
from test_replay_backlog import drop
from test_replay_node_model import assert_all_match, timeout_recording
from test_training import tiny_config

H = 3
STEADY = {'lin_vel_x': [0.4, 0.4], 'lin_vel_y': [0.1, 0.1], 'ang_vel_yaw': [0.2, 0.2],
          'standing_probability': 0.0, 'min_speed': 0.0}


def windows(obs: np.ndarray, dim: int) -> np.ndarray:
    """[N, H * dim] -> [N, H, dim]."""
    return obs.reshape(len(obs), -1, dim)


def test_a_window_starts_on_its_first_frame_and_moves_on_oldest_first():
    hist = ObservationHistory(2, 3, 2)
    first = np.array([[1, 1], [2, 2]], np.float32)
    np.testing.assert_array_equal(hist.restart(first), [[1, 1] * 3, [2, 2] * 3])
    hist.push(first + 10)
    out = hist.push(first + 20)
    np.testing.assert_array_equal(out[0], [1, 1, 11, 11, 21, 21])
    # What a world ended on, without moving its window; then one world restarts alone.
    np.testing.assert_array_equal(hist.with_newest(first[1:] + 30, np.array([1])),
                                  [[12, 12, 22, 22, 32, 32]])
    np.testing.assert_array_equal(hist.flat()[1], [2, 2, 12, 12, 22, 22])
    out = hist.restart(first[1:] + 40, np.array([1]))
    np.testing.assert_array_equal(out, [[1, 1, 11, 11, 21, 21], [42, 42] * 3])
    out = hist.push(first + 50, restart=np.array([0]))
    np.testing.assert_array_equal(out, [[51, 51] * 3, [42, 42, 42, 42, 52, 52]])
    for bad in (0, 101, 2.0, True, '3'):
        with pytest.raises(ValueError, match='history length'):
            ObservationHistory(1, bad, 2)


def test_the_env_window_is_the_frames_it_returned_and_restarts_at_a_reset(make_env, robot):
    dim = robot.policy_obs.dim
    env = make_env(num_envs=3, policy_history=H, episode_length_s=0.2, noise={'enabled': False},
                   commands=STEADY)
    assert env.obs_dims[POLICY] == H * dim == observation_dims(robot, env.cfg)[POLICY]
    obs, _ = env.reset()
    w = windows(obs[POLICY], dim)
    np.testing.assert_array_equal(w, np.repeat(obs[POLICY_NOISE_FREE][:, None], H, axis=1))
    rng = np.random.default_rng(0)
    resets = 0
    for _ in range(25):
        previous = w
        obs, _, terminated, truncated, extras = env.step(rng.normal(0, 0.3, (3, 12)))
        w = windows(obs[POLICY], dim)
        done = terminated | truncated
        np.testing.assert_array_equal(w[:, -1], obs[POLICY_NOISE_FREE])
        # Worlds going on shift their window by one; reset worlds restart on their frame.
        np.testing.assert_array_equal(w[~done, :-1], previous[~done, 1:])
        np.testing.assert_array_equal(w[done], np.repeat(w[done, -1:], H, axis=1))
        if done.any():
            resets += 1
            final = windows(extras['final_obs'][POLICY][done], dim)
            np.testing.assert_array_equal(final[:, :-1], previous[done, 1:])
            np.testing.assert_array_equal(final[:, -1],
                                          extras['final_obs'][POLICY_NOISE_FREE][done])
    assert resets >= 2


def test_the_env_window_holds_the_noisy_frames_and_resumes_bit_for_bit(make_env, robot):
    dim = robot.policy_obs.dim
    env = make_env(num_envs=2, policy_history=H)
    obs, _ = env.reset()
    actions = np.random.default_rng(1).normal(0, 0.3, (12, 2, 12))
    for a in actions[:4]:
        before = windows(obs[POLICY], dim)
        obs, *_ = env.step(a)
    after = windows(obs[POLICY], dim)
    assert not np.array_equal(after[:, -1], obs[POLICY_NOISE_FREE])  # noise is in the window
    np.testing.assert_array_equal(after[:, :-1], before[:, 1:])
    np.testing.assert_array_equal(env.observe()[POLICY], obs[POLICY])  # observing moves nothing
    state = env.get_state()
    first = [env.step(a)[0][POLICY] for a in actions[4:]]
    env.set_state(state)
    again = [env.step(a)[0][POLICY] for a in actions[4:]]
    np.testing.assert_array_equal(np.stack(first), np.stack(again))
    for bad in ({**state, 'policy_history': state['policy_history'][:, 1:]},
                {k: v for k, v in state.items() if k != 'policy_history'}):
        with pytest.raises(ValueError, match='another env.policy_history'):
            env.set_state(bad)
    np.testing.assert_array_equal(env.observe()[POLICY], again[-1])  # refused: unchanged


def memory_student(robot, path, history=H, seed=0):
    """A freshly initialised student reading ``history`` frames, exported for ``robot``."""
    torch.manual_seed(seed)
    dim = robot.policy_obs.dim
    policy = ActorCritic(history * dim, dim, robot.num_joints, actor_hidden_dims=[64, 64],
                         critic_hidden_dims=[16])
    with torch.no_grad():
        last = [m for m in policy.actor.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.weight.mul_(3.0)
    return policy, export_onnx(policy, robot, path, obs_history=history)


def test_a_student_with_memory_exports_its_window_and_is_refused_without_it(robot, tmp_path):
    policy, path = memory_student(robot, tmp_path / 'm.onnx')
    model = OnnxPolicy(path, robot)
    assert (model.obs_history, model.frame_dim, model.obs_dim) == (H, 47, H * 47)
    assert json.loads(model.metadata[METADATA_KEY])['obs_history'] == H
    obs = np.random.default_rng(0).normal(size=(5, H * 47)).astype(np.float32)
    with torch.no_grad():
        expected = policy.act_inference({'policy': torch.from_numpy(obs)}).numpy()
    np.testing.assert_allclose(model(obs), expected, atol=1e-5)
    with pytest.raises(ValueError, match=r'does not accept .* 1 frame\(s\) of 47 = \[47\].*'
                                         'obs_history'):
        export_onnx(policy, robot, tmp_path / 'one.onnx')
    with pytest.raises(ValueError, match=r'obs_history .* = 0'):
        export_onnx(policy, robot, tmp_path / 'zero.onnx', obs_history=0)
    assert not (tmp_path / 'one.onnx').exists() and not (tmp_path / 'zero.onnx').exists()


@pytest.mark.parametrize('value', [0, 101, 'three', 2.5, True, None, 2])
def test_a_model_whose_window_metadata_is_wrong_is_refused_by_name(robot, tmp_path, value):
    _, path = memory_student(robot, tmp_path / 'm.onnx')
    model = onnx.load(str(path))
    entry = next(p for p in model.metadata_props if p.key == METADATA_KEY)
    entry.value = json.dumps({**json.loads(entry.value), 'obs_history': value})
    bad = tmp_path / 'bad.onnx'
    onnx.save(model, str(bad))
    # 2 is a valid length that disagrees with the graph's input ([batch, 141], not 94).
    match = r"'obs' is tensor\(float\) .*141.*\[batch, 94\]" if value == 2 else \
        f'obs_history = {value!r}: expected a whole number'
    with pytest.raises(ModelError, match=match):
        OnnxPolicy(bad, robot)


def test_the_node_feeds_a_memory_model_the_envs_window_step_by_step(make_env, robot, tmp_path):
    """The policy node's assembler with a 3-frame model against the env's window over 30
    closed-loop steps (message-level arrays, the node's own last action and gait clock)."""
    _, path = memory_student(robot, tmp_path / 'm.onnx')
    policy = OnnxPolicy(path, robot)
    env = make_env(num_envs=1, policy_history=H, noise={'enabled': False},
                   randomization={'enabled': False}, commands=STEADY)
    obs, _ = env.reset()
    order = JointOrder(robot)
    assembler = ObservationAssembler(robot)
    assembler.set_history(policy.obs_history)
    assembler.gait_phase[:] = env.gait_phase
    for _ in range(30):
        s = env.robot_state()
        pos, vel = order.joint_arrays(robot.joint_names, s.joint_pos[0], s.joint_vel[0])
        quat, gyro = imu_arrays(list(s.base_quat[0, [1, 2, 3, 0]]), s.base_ang_vel[0])
        assembler.set_command(command_array(*env.commands[0]))
        frame = assembler.observe(pos, vel, quat, gyro)
        mine = assembler.model_input(frame)
        np.testing.assert_allclose(mine, obs[POLICY][0], rtol=1e-6, atol=1e-6)
        action = policy(mine)
        assembler.advance(action, frame)
        obs, *_ = env.step(action[None])
    assert np.ptp(windows(obs[POLICY], 47)[0, :, 24:36], axis=0).max() > 1e-3  # frames differ


class Spy:
    """Records what the controller hands its model."""

    def __init__(self, policy):
        self.policy, self.inputs = policy, []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def __call__(self, obs):
        self.inputs.append(np.array(obs))
        return self.policy(obs)


def test_the_controller_restarts_the_window_after_a_tick_it_did_not_act_on(robot, tmp_path):
    _, path = memory_student(robot, tmp_path / 'm.onnx')
    ctrl = PolicyController(robot)
    ctrl.load_path(path)
    spy = ctrl.policy = Spy(ctrl.policy)
    t = 100.0

    def tick(k, pos=None):
        nonlocal t
        t += 0.02
        ctrl.on_imu(t, [0, 0, 0, 1], [0, 0, 0], t)
        pos = robot.default_joint_pos + 0.01 * k if pos is None else pos
        return ctrl.on_joint_state(t, robot.joint_names, pos, np.zeros(12), t)

    for k in range(4):
        tick(k)
    w = [x.reshape(H, 47) for x in spy.inputs]
    assert len(w) == 4
    np.testing.assert_array_equal(w[0], np.repeat(w[0][-1:], H, axis=0))  # first: repeated
    for a, b in zip(w, w[1:]):
        np.testing.assert_array_equal(b[:-1], a[1:])  # then shifted by one acted-on frame
        assert not np.array_equal(b[-1], a[-1])
    bad = robot.default_joint_pos.copy()
    bad[3] = np.nan
    np.testing.assert_array_equal(tick(9, pos=bad), ctrl.measured_pose)  # a hold, no model
    assert len(spy.inputs) == 4
    for k in range(10, 40):
        tick(k)
        if len(spy.inputs) > 4:
            break
    restarted = spy.inputs[4].reshape(H, 47)
    np.testing.assert_array_equal(restarted, np.repeat(restarted[-1:], H, axis=0))


def test_a_window_mirrors_frame_by_frame(robot):
    cfg = from_dict(EnvConfig, {'policy_history': H}, source='test')
    mirrors = env_group_mirrors(robot, cfg)
    frames = np.random.default_rng(2).normal(size=(H, 47)).astype(np.float32)
    window = mirrors[POLICY](frames.reshape(-1))
    np.testing.assert_array_equal(window.reshape(H, 47),
                                  np.stack([mirrors[POLICY_NOISE_FREE](f) for f in frames]))


def test_the_control_loop_cannot_be_an_actor_for_a_student_with_memory():
    with pytest.raises(ConfigError, match='control_actor.*env.policy_history 1 .* has 4'):
        resolve(GRAPHS['train'], {'control_actor': 'true', 'set': 'env.policy_history=4'})


def test_a_student_with_memory_trains_exports_and_evaluates(robot, tmp_path):
    cfg = tiny_config(env={'policy_history': H},
                      runner={'max_iterations': 2, 'eval_episodes': 2})
    cfg.env.episode_length_s = 1.0
    runner = OnPolicyRunner(cfg, tmp_path)
    try:
        runner.learn()
        summary = export_and_evaluate(runner, robot, tmp_path)
    finally:
        runner.close()
    assert runner.policy.actor[0].in_features == H * 47
    model = OnnxPolicy(summary['student_onnx'])
    assert (model.obs_history, model.obs_dim) == (H, H * 47)
    assert summary['eval_forward_0.5']['episodes'] == 2
    # From the checkpoint too (claw-rl export): the window comes from its config.
    again = OnnxPolicy(export_checkpoint(ckpt.latest_checkpoint(tmp_path), tmp_path / 'c.onnx'))
    assert again.obs_history == H


def test_replay_reproduces_a_memory_model_tick_for_tick(robot, tmp_path):
    """A recording of the node serving a 3-frame model (cmd_vel timeouts, late states, lost
    commands) replays identically: the replay keeps the window the node kept."""
    _, path = memory_student(robot, tmp_path / 'm.onnx')
    loop = timeout_recording(robot, path)
    policy = OnnxPolicy(path)
    out = replay.replay_actions(loop.rec, robot, policy)
    assert_all_match(out, 180)
    assert out.timeouts == 3, out.format()
    lost = list(range(5, 180, 10))
    deaf = replay.replay_actions(drop(loop.rec, commands=lost), robot, policy)
    assert_all_match(deaf, 180, missing=len(lost))


def test_an_exported_memory_student_is_evaluated_with_its_window(robot, tmp_path):
    _, path = memory_student(robot, tmp_path / 'm.onnx')
    report = evaluate(OnnxPolicy(path, robot), EnvConfig(), robot, episodes=2,
                      command=(0.5, 0.0, 0.0))
    assert report.episodes == 2 and np.isfinite(report.tracking_error_vx)


def test_the_training_session_refuses_a_student_with_memory(robot):
    cfg = from_dict(EnvConfig, {'policy_history': 2}, source='test')
    with pytest.raises(ValueError, match='env.policy_history = 2: the control loop'):
        TrainingSession(robot, cfg)
