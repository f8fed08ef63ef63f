"""The control loop as an actor with real processes on loopback DDS: sim_node (training mode:
a 1-world env of the train config, randomisation, pushes and sensor noise on) + policy_node
(training mode: sampling around a trainer-exported student) publish rollout chunks on the
batched actors' topic; they decode with the trainer's spec, pass its gate (the same checks as
every chunk) and are learnt from next to a batched actor's chunk."""

import array
import copy
import hashlib
import time

import numpy as np
from std_msgs.msg import UInt8MultiArray

from claw_rl_ros.core.learning.train_config import load_train_config
from claw_rl_ros.core.live.batched_actor import BatchedActor
from claw_rl_ros.core.live.live_trainer import LiveTrainer
from claw_rl_ros.core.live.rollout_chunk import encode_chunk
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.nodes.ros_io import COMMAND_QOS, LATCHED_QOS
from ros_helpers import NodeProcess, stop_all
from test_nodes_trainer import TINY_YAML

CHUNKS = 6


def test_control_loop_chunks_have_the_batched_layout_and_pass_the_trainers_checks(
        ros_env, probe, tmp_path, robot):
    # Lockstep: every step is paired whatever the machine's load (realtime pairs only answers
    # within one control period; bench/loop_actor.py measures it).
    mode = 'lockstep'
    config = tmp_path / 'tiny.yaml'
    config.write_text(TINY_YAML)
    cfg = load_train_config(config)
    trainer = LiveTrainer(cfg, robot, tmp_path / 'run', tensorboard=False)
    model = trainer.export()
    sha = hashlib.sha256(model).hexdigest()
    topic = '/rollout_chunks'
    probe.subscribe(topic, UInt8MultiArray, COMMAND_QOS)
    mark = probe.count(topic)
    sim = NodeProcess('sim_node', ros_env, tmp_path, {
        'mode': mode, 'training': True, 'env_config': str(config), 'randomization': True,
        'pushes': True, 'noise': True, 'seed': 3})
    policy = NodeProcess('policy_node', ros_env, tmp_path, {
        'training': True, 'use_sim_time': True, 'seed': 4})
    try:
        probe.publish('/policy/model', UInt8MultiArray(data=array.array('B', model)),
                      LATCHED_QOS)
        probe.wait_subscribers('/policy/model', timeout=60)
        # The bytes are validated on arrival; activation retries until they have arrived.
        result = probe.activate_model('/policy_node', sha)
        assert result.successful, result.reason
        start = time.monotonic()
        first = probe.wait_for(topic, timeout=60, start=mark)
        t0 = time.monotonic()
        probe.wait_count(topic, mark + CHUNKS + 1, timeout=120)
        rate = CHUNKS * cfg.runner.num_steps_per_env / (time.monotonic() - t0)
        print(f'{mode}: first chunk after {t0 - start:.1f} s, then {rate:.0f} env steps/s')
        msgs = [first] + probe.since(topic, mark)[1:CHUNKS + 1]
    finally:
        codes = stop_all(policy, sim)
    assert all(code == 0 for code in codes.values()), (codes, sim.log, policy.log)
    chunks = []
    for msg in msgs:
        assert trainer.offer(msg.data) is None  # decode + lag filter, as trainer_node does
        chunks.append(trainer.pending[-1])
    seqs = [c.seq for c in chunks]
    print(f'{mode}: seq {seqs}')
    assert seqs == sorted(set(seqs))
    for c in chunks:
        assert (c.actor_id, c.num_envs, c.num_steps) == ('/control_loop', 1,
                                                         cfg.runner.num_steps_per_env)
        assert (c.policy_version, c.model_sha) == (0, sha[:12])
        assert c.values is None and np.abs(c.actions - c.mu).min() > 0
        # Sensor noise on: the policy's observation is noisy, but the command, last action and
        # gait clock it acted on are exactly the env's (the pairing's own check).
        assert np.abs(c.obs['policy'] - c.obs['policy_noise_free']).max() > 1e-3
        exact = slice(6, 9), slice(33, 47)
        for part in exact:
            np.testing.assert_allclose(c.obs['policy'][..., part],
                                       c.obs['policy_noise_free'][..., part], atol=1e-4)
    # One step's bootstrap is the next chunk's first observation (consecutive chunks).
    for a, b in zip(chunks, chunks[1:]):
        if b.seq == a.seq + 1:
            np.testing.assert_array_equal(a.last_obs['policy'][0], b.obs['policy'][0, 0])
    # The trainer learns from them next to a batched actor's chunk.
    batched = BatchedActor(VecLocomotionEnv(copy.deepcopy(cfg.env)),
                           copy.deepcopy(trainer.learner.policy), cfg.runner.num_steps_per_env,
                           '/a0')
    batched.load_policy(trainer.learner.policy.state_dict(), 0, sha[:12])
    assert trainer.offer(bytes(encode_chunk(batched.collect()))) is None
    batched.env.close()
    metrics = trainer.iterate()
    assert metrics['chunks'] == len(msgs) + 1 and np.isfinite(metrics['value_loss'])
    trainer.finish(stopped=True)
    assert 'training: sampling actions' in policy.log
    assert 'as /control_loop on /rollout_chunks' in sim.log


def test_train_graph_control_actor_learns_from_loop_and_batched_chunks_together(
        ros_env, tmp_path):
    """``claw-rl up train --control-actor true``: the trainer's iterations use the control
    loop's chunks next to the batched actor's, and none is started by loop chunks alone."""
    import re
    import signal
    from test_graph_runner import gone, up
    config = tmp_path / 'tiny.yaml'
    config.write_text(TINY_YAML)
    runner = up('train', '--config', str(config), '--actors', '1', '--run-dir',
                str(tmp_path / 'run'), '--control-actor', 'true', '--mode', 'lockstep',
                '--grace-s', '20', '--log-level', 'debug', env=ros_env, cwd=tmp_path)
    try:
        runner.wait_line(r'^\[trainer\] .*iteration \d+: \d+ chunks from /actor_0, '
                         r'/control_loop', timeout=300)
        runner.proc.send_signal(signal.SIGINT)
        assert runner.finish(timeout=60) == 0, runner.text
    finally:
        runner.kill_leftovers()
    assert all(gone(pid) for pid in runner.pids().values())
    iterations = re.findall(r'iteration \d+: \d+ chunks from ([^,]+(?:, /[\w/]+)*)',
                            runner.text)
    assert iterations and all('/actor_0' in line for line in iterations), iterations
