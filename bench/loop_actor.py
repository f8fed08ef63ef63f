"""The control loop as an actor, measured side by side in one run (ratios; not a test).

1. in-process (no ROS): the policy node's controller and the sim node's session wired
   directly, deploy mode (SimSession, mean actions) next to training mode (TrainingSession +
   ControlLoopActor, sampled actions, chunks): control steps/s and the ratio.
2. ROS lockstep: sim_node + policy_node in deploy mode next to training mode (same launch
   otherwise): control steps/s, steps/s that end up in chunks, discarded fraction by cause.
3. ROS realtime (50 Hz) in training mode: steps/s in chunks against the control rate.

Usage: .venv/bin/python bench/loop_actor.py [--seconds 20] [--steps 2000]
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path
import sys
import tempfile
import time

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'test'))
sys.path.insert(0, str(ROOT / 'bench'))
CONFIG = '''
env: {num_envs: 8, num_threads: 1}
policy: {actor_hidden_dims: [128, 128, 128], critic_hidden_dims: [256, 256, 128]}
runner: {num_steps_per_env: 24, seed: 1}
'''


def in_process(cfg, robot, model: bytes, steps: int, training: bool) -> float:
    """Control steps/s of the loop without ROS (deploy: SimSession, training: the actor)."""
    from claw_rl_ros.core.control.policy_controller import PolicyController
    from claw_rl_ros.core.live.loop_actor import ControlLoopActor
    from claw_rl_ros.core.sim.sim_session import SimSession
    from claw_rl_ros.core.sim.training_session import TrainingSession
    kind = TrainingSession if training else SimSession
    session = kind(robot, cfg.env, randomization=True, pushes=True, noise=True, seed=1)
    ctrl = PolicyController(robot, training=training)
    ctrl.activate(ctrl.offer(model)[0])
    actor = ControlLoopActor(session, cfg.runner.num_steps_per_env) if training else None
    start = time.perf_counter()
    for _ in range(steps):
        r = session.readings()
        if training:
            ctrl.on_command(*session.commands)
        ctrl.on_imu(r.time, (*r.imu_quat[1:], r.imu_quat[0]), r.imu_gyro, r.time)
        targets = ctrl.on_joint_state(r.time, robot.joint_names, r.joint_pos, r.joint_vel,
                                      r.time)
        session.set_targets(targets, r.time)
        if training:
            actor.add_record(ctrl.take_record())
            actor.step(r.time, session.active_targets(r.time))
        else:
            session.step(session.active_targets(r.time))
    rate = steps / (time.perf_counter() - start)
    session.close()
    return rate


def ros_loop(bench, config: Path, model: bytes, mode: str, training: bool,
             seconds: float) -> dict:
    """sim_node + policy_node for ``seconds``: control and chunk steps/s, discards."""
    from std_msgs.msg import UInt8MultiArray
    from claw_rl_ros.nodes.ros_io import LATCHED_QOS
    sim = bench.node('sim_node', {'mode': mode, 'training': training, 'env_config': str(config),
                                  'randomization': True, 'pushes': True, 'noise': True,
                                  'command_timeout_s': 0.2})
    policy = bench.node('policy_node', {'use_sim_time': True, 'training': training})
    try:
        sha = hashlib.sha256(model).hexdigest()
        bench.probe.publish('policy/model', UInt8MultiArray(data=model), LATCHED_QOS)
        bench.probe.wait_subscribers('policy/model', timeout=60)
        for _ in range(100):
            reply = bench.probe.set_parameter('/policy_node', 'model_sha256', sha, timeout=60)
            if reply.successful:
                break
        first = bench.status('sim_node', lambda v: int(v['steps']) > 100, timeout=60)
        t0 = time.monotonic()
        last = first
        while time.monotonic() - t0 < seconds:
            last = bench.status('sim_node')
        wall = time.monotonic() - t0
    finally:
        policy.stop(), sim.stop()
    out = {'steps_per_s': (int(last['steps']) - int(first['steps'])) / wall}
    if training:
        steps = 24 * (int(last['chunks']) - int(first['chunks']))
        lost = int(last['discarded_steps']) - int(first['discarded_steps'])
        out['chunk_steps_per_s'] = steps / wall
        out['discarded_fraction'] = lost / max(1, lost + steps)
        out['discards'] = {k[len('discarded_'):]: int(last[k]) - int(first[k]) for k in last
                           if k.startswith('discarded_') and k != 'discarded_steps'}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--seconds', type=float, default=20.0)
    parser.add_argument('--steps', type=int, default=2000)
    args = parser.parse_args()
    from claw_rl_ros.core.learning.train_config import load_train_config
    from claw_rl_ros.core.live.live_trainer import LiveTrainer
    from claw_rl_ros.core.sim.robot import load_robot
    from ros_control import Bench
    work = Path(tempfile.mkdtemp(prefix='bench_loop_actor_'))
    config = work / 'loop.yaml'
    config.write_text(CONFIG)
    cfg = load_train_config(config)
    robot = load_robot(cfg.env.robot)
    quiet = open(os.devnull, 'w')
    trainer = LiveTrainer(cfg, robot, work / 'run', tensorboard=False, stream=quiet)
    model = trainer.export()
    print(f'load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (a '
          'loaded machine starves the realtime loop: its steps are then discarded, not used)')
    deploy = in_process(cfg, robot, model, args.steps, False)
    train = in_process(cfg, robot, model, args.steps, True)
    print(f'in-process: deploy {deploy:.0f} steps/s, training {train:.0f} steps/s '
          f'(ratio {train / deploy:.2f})')
    bench = Bench(work)
    plain = ros_loop(bench, config, model, 'lockstep', False, args.seconds)
    lock = ros_loop(bench, config, model, 'lockstep', True, args.seconds)
    ratio = lock['steps_per_s'] / plain['steps_per_s']
    print(f'ROS lockstep: deploy {plain["steps_per_s"]:.0f} steps/s, training '
          f'{lock["steps_per_s"]:.0f} steps/s (ratio {ratio:.2f}), in chunks '
          f'{lock["chunk_steps_per_s"]:.0f} steps/s, discarded {lock["discarded_fraction"]:.1%} '
          f'{lock["discards"]}')
    real = ros_loop(bench, config, model, 'realtime', True, args.seconds)
    rate = 1.0 / robot.control_dt
    print(f'ROS realtime {rate:g} Hz training: {real["steps_per_s"]:.1f} steps/s, in chunks '
          f'{real["chunk_steps_per_s"]:.1f} steps/s ({real["chunk_steps_per_s"] / rate:.0%} of '
          f'the control rate), discarded {real["discarded_fraction"]:.1%} {real["discards"]}')
    if real['chunk_steps_per_s'] > 0:
        print(f'lockstep / realtime chunk steps/s: '
              f'{lock["chunk_steps_per_s"] / real["chunk_steps_per_s"]:.1f}x')
    bench.probe.close()
    trainer.finish(stopped=True)


if __name__ == '__main__':
    main()
