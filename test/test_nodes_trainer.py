"""trainer_node + two actor_nodes in two namespaces as real processes on loopback DDS: chunks of
both actors are used, the trainer pushes new students through the hot-swap mechanism (versions
advance at both actors), training goes on when an actor dies and a restarted actor gets the
current model, checkpoints are written, and every process stops cleanly."""

from pathlib import Path
import subprocess
import sys
import time

import array

import numpy as np
import pytest
from std_msgs.msg import Float32, String, UInt8MultiArray

from claw_rl_ros.core.learning.rollout_chunk import encode_chunk, RolloutChunk
from claw_rl_ros.nodes.ros_io import COMMAND_QOS, LATCHED_QOS
from ros_helpers import NodeProcess, probe, ros_env, ros_value, ROOT  # noqa: F401 - fixtures

TINY_YAML = '''
env: {num_envs: 8, episode_length_s: 0.5, num_threads: 1}
policy: {actor_hidden_dims: [32, 32], critic_hidden_dims: [32, 32]}
ppo: {num_learning_epochs: 1, num_mini_batches: 2}
runner: {num_steps_per_env: 8, seed: 3, keep_checkpoints: 2}
'''


class NamespacedNode(NodeProcess):
    """NodeProcess with a namespace (``-r __ns:=...``)."""

    def __init__(self, node, env, log_dir, params, namespace):
        self.name = f'{node}{namespace.replace("/", "_")}'
        self.log_path = Path(log_dir) / f'{self.name}.log'
        cmd = [sys.executable, '-m', f'claw_rl_ros.nodes.{node}', '--ros-args',
               '-r', f'__ns:={namespace}']
        for key, value in params.items():
            cmd += ['-p', f'{key}:={ros_value(value)}']
        self._log = open(self.log_path, 'w')
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)


def bad_chunks(robot) -> dict[str, bytes]:
    """A chunk with a NaN reward and a truncated one, sized for the tiny config."""
    t, n, a = 8, 2, robot.num_joints
    dims = {'policy': robot.policy_obs.dim, 'policy_noise_free': robot.policy_obs.dim,
            'privileged': robot.privileged_obs.dim}
    zeros = np.zeros((t, n), np.float32)
    rewards = zeros.copy()
    rewards[3, 1] = np.nan
    chunk = RolloutChunk(
        model_sha='0' * 12, policy_version=0, actor_id='/intruder', obs={
            g: np.zeros((t, n, d), np.float32) for g, d in dims.items()},
        actions=np.zeros((t, n, a), np.float32), mu=np.zeros((t, n, a), np.float32),
        sigma=np.ones((t, n, a), np.float32), log_probs=zeros, rewards=rewards,
        terminated=zeros > 0, truncated=zeros > 0,
        final_obs={g: np.zeros((0, d), np.float32) for g, d in dims.items()},
        last_obs={g: np.zeros((n, d), np.float32) for g, d in dims.items()})
    nan = bytes(encode_chunk(chunk))
    return {'non_finite': nan, 'truncated': nan[:len(nan) // 2]}


def distinct_versions(probe, topic):  # noqa: F811
    return {m.data for m in probe.since(topic, 0)}


def test_two_actors_feed_one_trainer_and_get_its_pushes(ros_env, probe, tmp_path,  # noqa: F811
                                                        robot):
    config = tmp_path / 'tiny.yaml'
    config.write_text(TINY_YAML)
    run_dir = tmp_path / 'run'
    for ns in ('/a', '/b'):
        probe.subscribe(f'{ns}/policy/model_version', String, LATCHED_QOS)
    probe.subscribe('/trainer/metrics/accepted', Float32, 10)
    for cause in ('non_finite', 'truncated'):
        probe.subscribe(f'/trainer/metrics/dropped/{cause}', Float32, 10)
    actors = [NamespacedNode('actor_node', ros_env, tmp_path, {'config': str(config),
                                                               'seed': i}, ns)
              for i, ns in enumerate(('/a', '/b'))]
    trainer = NodeProcess('trainer_node', ros_env, tmp_path, {
        'config': str(config), 'run_dir': str(run_dir), 'chunks_per_iteration': 2,
        'push_targets': ['/a/actor', '/b/actor']}, name='trainer')
    bad = {cause: UInt8MultiArray(data=array.array('B', payload))
           for cause, payload in bad_chunks(robot).items()}
    # The probe's chunk publisher, created now so it has matched the trainer when used below.
    probe.publish('/rollout_chunks', bad['truncated'], COMMAND_QOS)
    try:
        # Version 0 plus at least two trained pushes reach both actors.
        for ns in ('/a', '/b'):
            probe.wait_for(f'{ns}/policy/model_version',
                           lambda m, t=f'{ns}/policy/model_version':
                           len(distinct_versions(probe, t)) >= 3, timeout=240)
        accepted = probe.wait_for('/trainer/metrics/accepted', lambda m: m.data >= 4,
                                  timeout=60)
        # Bad chunks are dropped, counted by cause, and training goes on.
        # (Re-sent until counted: a busy trainer's keep-last queue may evict a sample.)
        for cause, msg in bad.items():
            for _ in range(12):
                probe.publish('/rollout_chunks', msg, COMMAND_QOS)
                if probe.wait_for(f'/trainer/metrics/dropped/{cause}', lambda m: m.data >= 1,
                                  timeout=10, fail=False):
                    break
            else:
                pytest.fail(f'no {cause} chunk was counted as dropped')
        # An actor dies: training goes on with the other one.
        assert actors[1].stop(timeout=60) == 0
        probe.wait_for('/trainer/metrics/accepted', lambda m: m.data >= accepted.data + 4,
                       timeout=120)
        # It comes back (holding no model): the trainer sends it the current model again.
        mark = probe.count('/b/policy/model_version')
        actors[1] = NamespacedNode('actor_node', ros_env, tmp_path,
                                   {'config': str(config), 'seed': 1}, '/b')
        probe.wait_for('/b/policy/model_version', lambda m: m.data not in ('none', ''),
                       timeout=120, start=mark)
    finally:
        codes = {}
        for proc in [trainer, *actors]:
            start = time.monotonic()
            codes[proc.name] = proc.stop(timeout=60)
            print(f'{proc.name} stopped in {time.monotonic() - start:.1f} s')
    log = trainer.log
    assert all(code == 0 for code in codes.values()), (codes, log)
    # Each iteration used chunks from both namespaces (lag 0: both acted with the same model).
    assert 'chunks from /a/actor, /b/actor' in log, log
    assert '/a/actor now acts with' in log and '/b/actor now acts with' in log
    assert sorted(p.name for p in (run_dir / 'checkpoints').iterdir())
    assert (run_dir / 'models' / 'student_v2.onnx').is_file()


@pytest.mark.parametrize('node', ['actor_node', 'trainer_node'])
def test_nodes_refuse_a_missing_config_with_the_reason(ros_env, tmp_path, node):  # noqa: F811
    proc = NodeProcess(node, ros_env, tmp_path, {'config': str(tmp_path / 'nope.yaml')})
    assert proc.wait_exit(60) != 0
    proc.stop()
    assert 'nope.yaml' in proc.log
