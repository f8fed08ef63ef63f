"""trainer_node + two actor_nodes in two namespaces as real processes on loopback DDS: chunks of
both actors are used, the trainer pushes new students through the hot-swap mechanism (versions
advance at both actors), training goes on when an actor dies and a restarted actor gets the
current model, checkpoints are written, and every process stops cleanly."""

import json
import os
from pathlib import Path
import re
import shutil
import signal
import subprocess
import sys
import time

import array

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
import pytest
from std_msgs.msg import Float32, String, UInt8MultiArray

from claw_rl_ros.core.live.rollout_chunk import encode_chunk, RolloutChunk
from claw_rl_ros.nodes.ros_io import COMMAND_QOS, LATCHED_QOS, STATE_QOS
from ros_helpers import node_module, NodeProcess, ros_value, ROOT

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
        cmd = [sys.executable, '-m', node_module(node), '--ros-args',
               '-r', f'__ns:={namespace}']
        for key, value in params.items():
            cmd += ['-p', f'{key}:={ros_value(value)}']
        self._log = open(self.log_path, 'w')
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)


def zero_chunk(robot, t=8, n=2, version=0, sha='0' * 12) -> RolloutChunk:
    """A chunk of zeros (finite, well-formed) sized t x n for the tiny config's robot."""
    a = robot.num_joints
    dims = {'policy': robot.policy_obs.dim, 'policy_noise_free': robot.policy_obs.dim,
            'privileged': robot.privileged_obs.dim}
    zeros = np.zeros((t, n), np.float32)
    return RolloutChunk(
        model_sha=sha, policy_version=version, actor_id='/intruder', obs={
            g: np.zeros((t, n, d), np.float32) for g, d in dims.items()},
        actions=np.zeros((t, n, a), np.float32), mu=np.zeros((t, n, a), np.float32),
        sigma=np.ones((t, n, a), np.float32), log_probs=zeros.copy(), rewards=zeros.copy(),
        terminated=zeros > 0, truncated=zeros > 0,
        final_obs={g: np.zeros((0, d), np.float32) for g, d in dims.items()},
        last_obs={g: np.zeros((n, d), np.float32) for g, d in dims.items()})


def bad_chunks(robot) -> dict[str, bytes]:
    """One chunk per drop cause, sized for the tiny config (stale: version 0 once the trainer
    is past it; unknown: a version it never published)."""
    nan = zero_chunk(robot)
    nan.rewards[3, 1] = np.nan
    nan = bytes(encode_chunk(nan))
    return {'non_finite': nan, 'truncated': nan[:len(nan) // 2],
            'wrong_size': bytes(encode_chunk(zero_chunk(robot, t=4))),
            'unknown_version': bytes(encode_chunk(zero_chunk(robot, version=10 ** 6))),
            'stale_version': bytes(encode_chunk(zero_chunk(robot, version=0)))}


def distinct_versions(probe, topic):
    return {m.data for m in probe.since(topic, 0)}


def models_of(probe, topic):
    """The models (12-character versions) a model_version topic reported acting with."""
    return {v[:12] for v in distinct_versions(probe, topic)} - {'none', ''}


def acting(msg: DiagnosticArray) -> dict[str, str]:
    """The trainer's ``acting <target>`` fields of a /diagnostics message: target -> version."""
    return {kv.key.removeprefix('acting '): kv.value for s in msg.status
            if s.name == 'trainer: trainer' for kv in s.values if kv.key.startswith('acting ')}


def test_two_actors_feed_one_trainer_and_get_its_pushes(ros_env, probe, tmp_path,
                                                        robot):
    config = tmp_path / 'tiny.yaml'
    config.write_text(TINY_YAML)
    run_dir = tmp_path / 'run'
    for ns in ('/a', '/b'):
        probe.subscribe(f'{ns}/actor/model_version', String, STATE_QOS)
    probe.subscribe('/trainer/metrics/accepted', Float32, 10)
    probe.subscribe('/diagnostics', DiagnosticArray, 50)
    bad = {cause: UInt8MultiArray(data=array.array('B', payload))
           for cause, payload in bad_chunks(robot).items()}
    for cause in bad:
        probe.subscribe(f'/trainer/metrics/dropped/{cause}', Float32, 10)
    actors = [NamespacedNode('actor_node', ros_env, tmp_path, {'config': str(config),
                                                               'seed': i}, ns)
              for i, ns in enumerate(('/a', '/b'))]
    # An actor that refuses every model (too large for it): logged with its reason, and
    # training goes on with the others.
    picky = NamespacedNode('actor_node', ros_env, tmp_path, {
        'config': str(config), 'seed': 2, 'max_model_bytes': 1000}, '/c')
    trainer = NodeProcess('trainer_node', ros_env, tmp_path, {
        'config': str(config), 'run_dir': str(run_dir), 'chunks_per_iteration': 2,
        'batch_timeout_s': 2.0, 'push_targets': ['/a/actor', '/b/actor', '/c/actor']},
        name='trainer', log_level='debug')  # the per-push lines asserted below are DEBUG
    # The probe's chunk publisher, created now so it has matched the trainer when used below.
    probe.publish('/rollout_chunks', bad['truncated'], COMMAND_QOS)
    try:
        # Version 0 plus at least two trained pushes reach both actors.
        for ns in ('/a', '/b'):
            probe.wait_for(f'{ns}/actor/model_version',
                           lambda m, t=f'{ns}/actor/model_version':
                           len(distinct_versions(probe, t)) >= 3, timeout=240)
        # /diagnostics names the model each target acknowledged (the per-push log lines are
        # DEBUG): one that actor itself reported acting with; none for the one refusing all.
        probe.wait_for('/diagnostics', lambda m: acting(m).get('/c/actor') == 'none' and all(
            acting(m).get(f'{ns}/actor') in models_of(probe, f'{ns}/actor/model_version')
            for ns in ('/a', '/b')), timeout=30)
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
        # An actor is killed: training goes on with the other one (batches time out after
        # 2 s instead of waiting for its chunk).
        actors[1].proc.kill()
        actors[1].stop()
        probe.wait_for('/trainer/metrics/accepted', lambda m: m.data >= accepted.data + 4,
                       timeout=120)
        # It comes back (holding no model): the trainer sends it the current model again.
        mark = probe.count('/b/actor/model_version')
        actors[1] = NamespacedNode('actor_node', ros_env, tmp_path,
                                   {'config': str(config), 'seed': 1}, '/b')
        probe.wait_for('/b/actor/model_version', lambda m: m.data not in ('none', ''),
                       timeout=120, start=mark)
    finally:
        codes = {}
        for proc in [trainer, *actors, picky]:
            start = time.monotonic()
            codes[proc.name] = proc.stop(timeout=60)
            print(f'{proc.name} stopped in {time.monotonic() - start:.1f} s')
    log = trainer.log
    assert all(code == 0 for code in codes.values()), (codes, log)
    # Each iteration used chunks from both namespaces (lag 0: both acted with the same model).
    assert 'chunks from /a/actor, /b/actor' in log, log
    assert '/a/actor now acts with' in log and '/b/actor now acts with' in log
    # The refusal is logged with the actor's reason, and iterations went on after it.
    refusals = [line for line in log.splitlines() if '/c/actor refused' in line]
    assert any('over the size cap of 1000' in line for line in refusals), refusals
    # (Any iteration after the first refusal: on a fast machine the trainer may be past
    # iteration 4 before /c/actor's service is discovered and first refuses.)
    assert re.search(r'iteration \d+:', log[log.index('/c/actor refused'):]), log
    assert 'now acts with' not in picky.log
    assert sorted(p.name for p in (run_dir / 'checkpoints').iterdir())
    assert (run_dir / 'models' / 'student_v2.onnx').is_file()


def test_the_time_budget_ends_training_when_no_chunk_comes_any_more(
        ros_env, probe, tmp_path):
    """Every actor gone (host down, link cut): no iteration can start, yet the budget is
    spent; the trainer writes its summary and exits 0 instead of waiting forever."""
    config = tmp_path / 'tiny.yaml'
    config.write_text(TINY_YAML)
    run_dir = tmp_path / 'run'
    probe.subscribe('/trainer/metrics/accepted', Float32, 10)
    mark = probe.count('/trainer/metrics/accepted')  # (the module's probe heard other trainers)
    budget = 12.0
    trainer = NodeProcess('trainer_node', ros_env, tmp_path, {
        'config': str(config), 'run_dir': str(run_dir), 'time_budget_s': budget,
        'max_iterations': 10 ** 6, 'push_targets': ['/a/actor']}, name='trainer')
    actor = NamespacedNode('actor_node', ros_env, tmp_path, {'config': str(config)}, '/a')
    try:
        probe.wait_for('/trainer/metrics/accepted', lambda m: m.data >= 1, timeout=240,
                       start=mark)
        actor.proc.kill()
        actor.stop()
        code = trainer.wait_exit(budget + 60)
    finally:
        trainer.stop()
        actor.stop()
    assert code == 0, trainer.log
    summary = json.loads((run_dir / 'summary.json').read_text())
    assert summary['wall_time_s'] >= budget and summary['iterations'] >= 1, summary
    assert 'training done' in trainer.log


@pytest.mark.parametrize('node', ['actor_node', 'trainer_node'])
def test_nodes_refuse_a_missing_config_with_the_reason(ros_env, tmp_path, node):
    proc = NodeProcess(node, ros_env, tmp_path, {'config': str(tmp_path / 'nope.yaml')})
    assert proc.wait_exit(60) != 0
    proc.stop()
    assert 'nope.yaml' in proc.log


def test_trainer_killed_and_restarted_resumes_while_the_policy_node_keeps_control(
        ros_env, probe, tmp_path, robot):
    """sim_node + policy_node (/robot) and one actor (/a) fed by a trainer that is SIGKILLed:
    the policy node keeps commanding with its last model; a restarted trainer (resume) goes on
    from its newest checkpoint: same iteration counter, same weights, new pushes."""
    from std_msgs.msg import Float64MultiArray
    from claw_rl_ros.core.export.onnx_export import deployed_action, random_observations
    from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
    from claw_rl_ros.core.learning import checkpoint as ckpt
    from claw_rl_ros.core.learning.learner import load_policy
    import torch
    config = tmp_path / 'tiny.yaml'
    config.write_text(TINY_YAML)
    run_dir = tmp_path / 'run'
    version_topic = '/robot/policy/model_version'
    probe.subscribe(version_topic, String, LATCHED_QOS)
    probe.subscribe('/robot/joint_commands', Float64MultiArray, COMMAND_QOS)
    sim = NamespacedNode('sim_node', ros_env, tmp_path, {'mode': 'realtime'}, '/robot')
    policy = NamespacedNode('policy_node', ros_env, tmp_path, {'use_sim_time': True}, '/robot')
    actor = NamespacedNode('actor_node', ros_env, tmp_path, {'config': str(config)}, '/a')
    params = {'config': str(config), 'run_dir': str(run_dir),
              'push_targets': ['/robot/policy_node', '/a/actor']}
    trainer = NodeProcess('trainer_node', ros_env, tmp_path, params, name='trainer')
    restarted = None
    try:
        # Three models (version 0 and two trained ones) reach the policy node.
        probe.wait_for(version_topic, lambda m: len(distinct_versions(probe, version_topic) -
                                                    {'none', ''}) >= 3, timeout=240)
        trainer.proc.kill()
        assert trainer.stop() == -9
        last = ckpt.latest_checkpoint(run_dir)
        iteration = int(last.stem.split('_')[1])
        # The resumed trainer prunes old checkpoints as it goes on: keep this one's weights.
        kept = tmp_path / 'killed_at.pt'
        shutil.copyfile(last, kept)
        serving = probe.since(version_topic, 0)[-1].data
        # The policy node goes on controlling with the last model it activated.
        mark = probe.count('/robot/joint_commands')
        probe.wait_for('/robot/joint_commands', timeout=30, start=mark + 100)
        assert probe.since(version_topic, 0)[-1].data == serving
        assert policy.alive() and sim.alive()
        # Restarted with resume: the iteration counter and weights of the newest checkpoint.
        restarted = NodeProcess('trainer_node', ros_env, tmp_path, {**params, 'resume': True},
                                name='trainer2', log_level='debug')
        mark = probe.count(version_topic)
        probe.wait_for(version_topic, lambda m: m.data not in (serving, 'none', ''),
                       timeout=120, start=mark)
        probe.wait_for(version_topic, timeout=240, start=probe.count(version_topic))
    finally:
        codes = {p.name: p.stop(timeout=60) for p in
                 [p for p in (restarted, actor, policy, sim) if p is not None]}
    log = restarted.log
    assert f'resumed from {last} (iteration {iteration})' in log, log
    assert f'iteration {iteration + 1}:' in log, log
    assert f'iteration {iteration}:' not in log  # nothing learnt twice
    assert all(code == 0 for code in codes.values()), codes
    # The re-exported student of that iteration is the checkpoint's policy.
    student, cfg, _ = load_policy(kept)
    obs = random_observations(robot.policy_obs.dim, 64, seed=0)
    onnx = OnnxPolicy(run_dir / 'models' / f'student_v{iteration}.onnx', robot)
    with torch.no_grad():
        expected = deployed_action(student, torch.from_numpy(obs), cfg.env.clip_actions).numpy()
    np.testing.assert_allclose(onnx(obs), expected, atol=1e-5)


def publishers(probe, topic, expected, timeout=30.0):
    """Names of the nodes publishing ``topic`` once they are ``expected`` (graph discovery
    has no event to wait on: polled), else as they are at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        names = sorted(i.node_name for i in probe.node.get_publishers_info_by_topic(topic))
        if names == expected or time.monotonic() > deadline:
            return names
        time.sleep(0.1)


def test_train_graph_ctrl_c_checkpoints_then_resumes_to_its_time_budget(
        ros_env, probe, tmp_path):
    """``claw-rl up train``: Ctrl-C stops every process cleanly with a checkpoint, curve and
    summary; the same run directory is refused without resume; with resume it goes on from the
    checkpoint and the graph ends by itself when the time budget is spent, with student.onnx
    and its evaluation. Each latched version topic has one publisher: the actors their own
    (both actors and the policy node published on /policy/model_version, so a late joiner
    read an arbitrary one's oldest value). The terminal shows the progress line and the
    result, not a line per push (those are DEBUG)."""
    import json
    from claw_rl_ros.core.learning import checkpoint as ckpt
    from test_graph_runner import gone, up
    config = tmp_path / 'tiny.yaml'
    config.write_text(TINY_YAML)
    run_dir = tmp_path / 'run'
    probe.subscribe('/trainer/metrics/iteration', Float32, 10)
    common = ('--config', str(config), '--actors', '2', '--run-dir', str(run_dir))
    runner = up('train', *common, '--grace-s', '20', env=ros_env, cwd=tmp_path)
    try:
        probe.wait_for('/trainer/metrics/iteration', lambda m: m.data >= 2, timeout=240)
        for topic, nodes in (('/actor_0/model_version', ['actor_0']),
                             ('/actor_1/model_version', ['actor_1']),
                             ('/policy/model_version', ['policy_node'])):
            # One publisher each (the point); its name when discovery delivered it (rmw
            # reports _NODE_NAME_UNKNOWN_ for a participant whose node info was not received).
            found = publishers(probe, topic, nodes)
            assert len(found) == len(nodes) and all(
                n in nodes or n == '_NODE_NAME_UNKNOWN_' for n in found), (topic, found)
        runner.proc.send_signal(signal.SIGINT)
        assert runner.finish(timeout=60) == 0, runner.text
    finally:
        runner.kill_leftovers()
    assert all(gone(pid) for pid in runner.pids().values())
    first = json.loads((run_dir / 'summary.json').read_text())
    assert first['stopped_by_user'] is True and first['iterations'] >= 2, first
    assert ckpt.latest_checkpoint(run_dir) == ckpt.checkpoint_path(run_dir, first['iterations'])
    assert (run_dir / 'learning_curve.png').is_file()
    assert not (run_dir / 'student.onnx').exists()
    refused = up('train', *common, env=ros_env, cwd=tmp_path)
    assert refused.finish(timeout=120) != 0
    assert 'set resume to true' in refused.text, refused.text
    budget = first['wall_time_s'] + 3.0
    resumed = up('train', *common, '--resume', 'true', '--time-budget', str(budget),
                 env=ros_env, cwd=tmp_path)
    try:
        assert resumed.finish(timeout=300) == 0, resumed.text
    finally:
        resumed.kill_leftovers()
    assert f'(iteration {first["iterations"]})' in resumed.text
    summary = json.loads((run_dir / 'summary.json').read_text())
    assert summary['stopped_by_user'] is False, summary
    assert summary['iterations'] > first['iterations']
    # Pushes went to two actors and the policy node, silently; the progress line and the
    # result are what the terminal shows.
    per_push = re.compile(r'now acts with|hot swap: now serving|received and validated|'
                          r'iteration \d+: \d+ chunks')
    assert not [line for line in resumed.lines if per_push.search(line)], resumed.text
    assert re.search(r'^\[trainer\] it +\d+/\d+ \| steps/s', resumed.text, re.M), resumed.text
    assert '[trainer] evaluation at 0.5 m/s forward:' in resumed.text, resumed.text
    assert summary['wall_time_s'] >= budget
    assert summary['eval_forward_0.5']['episodes'] == 20
    assert (run_dir / 'student.onnx').is_file()


def test_actor_collects_only_once_a_trainer_listens_and_makes_up_for_a_lost_chunk(
        ros_env, probe, tmp_path, robot):
    """Chunks published before the trainer's subscription matched were lost, and with them the
    actor's credit: trainer and actor then waited for each other forever (seen in CI). The
    actor now collects only while its chunk topic has a subscriber, and gives itself one credit
    back after credit_timeout_s without a new model."""
    from claw_rl_ros.core.learning.train_config import load_train_config
    from claw_rl_ros.core.live.live_trainer import LiveTrainer
    import hashlib
    config = tmp_path / 'tiny.yaml'
    config.write_text(TINY_YAML)
    trainer = LiveTrainer(load_train_config(config), robot, tmp_path / 'run',
                          tensorboard=False)
    model = trainer.export()

    def decode(msg):  # as trainer_node does: decoded and checked by the trainer's gate
        assert trainer.offer(msg.data) is None
        return trainer.pending[-1]

    sha = hashlib.sha256(model).hexdigest()
    topic = '/solo/chunks'
    actor = NamespacedNode('actor_node', ros_env, tmp_path, {
        'config': str(config), 'chunk_topic': topic, 'chunks_in_flight': 1,
        'credit_timeout_s': 2.0}, '/solo')
    try:
        probe.publish('/solo/policy/model', UInt8MultiArray(data=array.array('B', model)),
                      LATCHED_QOS)
        probe.wait_subscribers('/solo/policy/model', timeout=60)
        # The bytes are validated on arrival; activation retries until they have arrived.
        result = probe.activate_model('/solo/actor', sha)
        assert result.successful, result.reason
        # The actor holds a model and a credit, and nobody listens: it waits (says so).
        deadline = time.monotonic() + 60
        while 'waiting for a subscriber on /solo/chunks' not in actor.log:
            assert time.monotonic() < deadline and actor.alive(), actor.log
            time.sleep(0.05)
        # A negative check needs a window: longer than the credit timeout, in which an actor
        # that published into the void would lose chunk 1 and then collect chunk 2.
        time.sleep(3.0)
        probe.subscribe(topic, UInt8MultiArray, COMMAND_QOS)
        first = decode(probe.wait_for(topic, timeout=60))
        assert first.seq == 1 and first.model_sha == sha[:12]
        # No new model comes (as if the chunk was lost): after 2 s one more chunk, with a
        # warning.
        t0 = time.monotonic()
        second = decode(probe.wait_count(topic, 2, timeout=60)[1])
        assert second.seq == 2 and time.monotonic() - t0 > 1.0
    finally:
        code = actor.stop(timeout=30)
    trainer.finish(stopped=True)
    assert code == 0, actor.log
    assert 'no new model 2 s after the last chunk: collecting one more' in actor.log


SAC_TINY_YAML = '''
algorithm: sac
env: {num_envs: 8, episode_length_s: 0.5, num_threads: 1}
policy: {actor_hidden_dims: [32, 32], critic_hidden_dims: [32, 32]}
sac: {learning_starts: 128, batch_size: 32, utd_ratio: 0.125, buffer_size: 20000,
      action_bound: 2.0, matmul_dtype: float32}
runner: {num_steps_per_env: 8, seed: 3, keep_checkpoints: 2, eval_episodes: 2}
'''


def test_train_graph_trains_sac_live_with_the_same_nodes(ros_env, tmp_path):
    """``algorithm: sac`` in the config and nothing else: the same trainer, actor and control
    loop nodes train SAC live to the time budget; actors explore with the squashed Gaussian
    (the pushed models say so), gradient steps start after learning_starts, and the run ends
    with a SAC student.onnx and its evaluation."""
    import json
    import onnx
    from test_graph_runner import gone, up
    config = tmp_path / 'sac.yaml'
    config.write_text(SAC_TINY_YAML)
    run_dir = tmp_path / 'run'
    # --log-level debug: the per-push lines asserted below.
    runner = up('train', '--config', str(config), '--actors', '1', '--run-dir', str(run_dir),
                '--time-budget', '15', '--log-level', 'debug', env=ros_env, cwd=tmp_path)
    try:
        assert runner.finish(timeout=300) == 0, runner.text
    finally:
        runner.kill_leftovers()
    assert all(gone(pid) for pid in runner.pids().values())
    assert '/actor_0 now acts with' in runner.text and '/policy_node now acts with' in \
        runner.text, runner.text
    summary = json.loads((run_dir / 'summary.json').read_text())
    assert summary['stopped_by_user'] is False and summary['iterations'] >= 4, summary
    assert summary['eval_forward_0.5']['episodes'] == 2
    with open(run_dir / 'metrics.csv') as f:
        rows = list(__import__('csv').DictReader(f))
    updates = [float(r['updates']) for r in rows]
    # 64 transitions per chunk: none while fewer than 128 are stored, then 8 per chunk.
    assert updates[0] == 0.0 and set(updates[1:]) == {8.0}, updates
    assert all(float(r['ent_coef']) > 0 for r in rows)
    model = onnx.load(str(run_dir / 'student.onnx'))
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta['algorithm']) == 'sac'
    pushed = sorted((run_dir / 'models').glob('student_v*.onnx'))
    assert pushed and all(json.loads({p.key: p.value for p in onnx.load(str(m)).metadata_props}
                                     ['behaviour'])['kind'] == 'squashed_gaussian'
                          for m in pushed[-2:])


def test_train_graph_restarts_a_crashed_actor_and_trains_on(ros_env, tmp_path):
    """An actor that dies of a native crash (SIGSEGV, as CI saw once) is started again: the
    trainer pushes it the current student and learns from its chunks to the end of the run;
    the crash is logged with the actor's Python stacks."""
    from test_graph_runner import gone, up
    config = tmp_path / 'tiny.yaml'
    config.write_text(TINY_YAML)
    run_dir = tmp_path / 'run'
    runner = up('train', '--config', str(config), '--actors', '1', '--run-dir', str(run_dir),
                '--control-loop', 'false', '--set', 'runner.max_iterations=30', env=ros_env,
                cwd=tmp_path)
    try:
        runner.wait_line(r'^\[trainer\] .*/actor_0 joined', timeout=120)
        old = runner.pids()['actor_0']
        os.kill(old, signal.SIGSEGV)
        runner.wait_line(r'^\[up\] actor_0 died \(killed by SIGSEGV\): restarting it in 1 s$')
        new = int(runner.wait_line(rf'^\[up\] started actor_0 \(pid (?!{old}\b)(\d+)\)',
                                   timeout=30)[1])
        assert runner.finish(timeout=300) == 0, runner.text
    finally:
        runner.kill_leftovers()
    assert gone(old) and gone(new)
    lines = runner.text.splitlines()
    assert 'Fatal Python error: Segmentation fault' in runner.text, runner.text
    restart = next(i for i, line in enumerate(lines) if f'started actor_0 (pid {new})' in line)
    # Iterations learnt after the restart: the old actor had at most two chunks in flight
    # (the graph's overlap: chunks_in_flight 2), so the new one's chunks made all but two.
    after = [line for line in lines[restart:] if re.match(r'^\[trainer\] it +\d+/30 ', line)]
    assert len(after) >= 3 and after[-1].startswith('[trainer] it    30/30 '), runner.text
    assert json.loads((run_dir / 'summary.json').read_text())['iterations'] == 30
