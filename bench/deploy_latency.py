"""Deploy path latency, /joint_states -> command, with the safety state machine in the loop.

A 50 Hz "robot" in this process sends Imu + JointState (the deploy graph's topics and QoS) to a
policy_node started as the deploy graph starts it (autostart off, self-check, e-stop, shaping,
gains on), waits for the command that answers each state and times it (send -> receive, one
state in flight). Measured side by side in one run:

* PASSIVE (damping: no policy call) and RL (policy + fade-in + shaping) of this branch;
* with ``--baseline DIR``: the same RL path of the policy node in another checkout (e.g. the
  main branch without the state machine), started from that checkout's code.

Prints p50/p99 [ms] of the external round trip and of the node's own callback -> publish
latency (its /diagnostics), and ratios. Not a test: no timed asserts.

Usage: .venv/bin/python bench/deploy_latency.py [--model student.onnx] [--samples 500]
       [--baseline /work/main]
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
import random
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STUDENT = max((ROOT / 'runs').glob('*/student.onnx'), key=lambda p: p.stat().st_mtime,
              default=None)


class Robot:
    """The bench's node: publishes state, times the answering command, calls services."""

    def __init__(self, robot):
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.node import Node
        from diagnostic_msgs.msg import DiagnosticArray
        from sensor_msgs.msg import Imu, JointState
        from std_msgs.msg import Float64MultiArray
        from claw_rl_ros.nodes.ros_io import COMMAND_QOS
        self.rclpy, self.robot = rclpy, robot
        self.context = Context()
        rclpy.init(context=self.context)
        self.node = Node('bench_robot', context=self.context)
        self.pub_imu = self.node.create_publisher(Imu, 'imu', 10)
        self.pub_js = self.node.create_publisher(JointState, 'joint_states', 10)
        self.Imu, self.JointState = Imu, JointState
        self.got = threading.Event()
        self.pace = threading.Event()  # never set: waits on it are pure pacing
        self.diag: dict[str, dict[str, str]] = {}
        self.node.create_subscription(Float64MultiArray, 'joint_commands',
                                      lambda m: self.got.set(), COMMAND_QOS)
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self.on_diag, 10)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.spin, daemon=True)
        self.thread.start()

    def spin(self):
        try:
            while self.context.ok():
                self.executor.spin_once(timeout_sec=0.05)
        except Exception:  # noqa: BLE001 - shut down under the executor
            pass

    def on_diag(self, msg):
        for s in msg.status:
            self.diag[s.name.split(':')[0]] = {kv.key: kv.value for kv in s.values}

    def send(self) -> float | None:
        """One state; seconds until its command arrived (None: no answer within 100 ms)."""
        from claw_rl_ros.nodes.ros_io import to_stamp
        self.got.clear()
        start = time.perf_counter()
        stamp = to_stamp(time.time())
        imu = self.Imu()
        imu.header.stamp, imu.orientation.w = stamp, 1.0
        js = self.JointState(name=list(self.robot.joint_names),
                             position=[float(v) for v in self.robot.default_joint_pos],
                             velocity=[0.0] * 12)
        js.header.stamp = stamp
        self.pub_imu.publish(imu)
        self.pub_js.publish(js)
        return time.perf_counter() - start if self.got.wait(0.1) else None

    def run(self, samples: int, dt: float) -> list[float]:
        """``samples`` states at the control rate; the answered ones' latencies [s]."""
        out, next_t = [], time.perf_counter()
        for _ in range(samples):
            latency = self.send()
            if latency is not None:
                out.append(latency)
            next_t = max(next_t + dt, time.perf_counter())
            self.pace.wait(max(0.0, next_t - time.perf_counter()))
        return out

    def trigger(self, name: str) -> tuple[bool, str]:
        from std_srvs.srv import Trigger
        client = self.node.create_client(Trigger, f'/policy_node/{name}')
        try:
            if not client.wait_for_service(timeout_sec=20):
                return False, 'no service'
            future = client.call_async(Trigger.Request())
            done = threading.Event()
            future.add_done_callback(lambda f: done.set())
            done.wait(10)
            reply = future.result()
            return reply.success, reply.message
        finally:
            self.node.destroy_client(client)

    def close(self):
        self.context.try_shutdown()
        self.thread.join(timeout=5)


def start_node(env, cwd: Path, params: dict, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, '-m', 'claw_rl_ros.nodes.policy_node', '--ros-args']
    for key, value in params.items():
        value = ('true' if value else 'false') if isinstance(value, bool) else value
        cmd += ['-p', f'{key}:={value}']
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=open(log, 'w'),
                            stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(2)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def pct(values: list[float]) -> tuple[float, float]:
    ms = np.asarray(values) * 1e3
    return (float(np.percentile(ms, 50)), float(np.percentile(ms, 99))) if ms.size else \
        (math.nan, math.nan)


def wait_answers(bench: Robot, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while bench.send() is None:
        if time.time() > deadline:
            raise SystemExit('the policy node never answered a state')


def node_latency(bench: Robot, name: str) -> tuple[str, str]:
    """The node's own p50/p99 from its next /diagnostics message."""
    bench.diag.pop(name, None)
    deadline = time.time() + 5
    while name not in bench.diag and time.time() < deadline:
        bench.pace.wait(0.05)
    d = bench.diag.get(name, {})
    return d.get('latency_p50_ms', '?'), d.get('latency_p99_ms', '?')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--model', type=Path, default=STUDENT)
    parser.add_argument('--samples', type=int, default=500)
    parser.add_argument('--baseline', type=Path, help='another checkout (no state machine)')
    args = parser.parse_args()
    from claw_rl_ros.core.sim.robot import load_robot
    robot = load_robot('claw_quadruped')
    if args.model is None or not args.model.is_file():
        raise SystemExit('give --model student.onnx (none found in runs/)')
    tmp = Path(tempfile.mkdtemp(prefix='deploy_latency_'))
    env = {**os.environ, 'ROS_DOMAIN_ID': str(random.SystemRandom().randint(1, 100)),
           'ROS_AUTOMATIC_DISCOVERY_RANGE': 'LOCALHOST', 'ROS_HOME': str(tmp),
           'ROS_LOG_DIR': str(tmp / 'log'), 'PYTHONUNBUFFERED': '1'}
    os.environ.update({k: env[k] for k in ('ROS_DOMAIN_ID', 'ROS_AUTOMATIC_DISCOVERY_RANGE',
                                           'ROS_HOME', 'ROS_LOG_DIR')})
    controllers = ROOT / 'config' / 'ros2_control_claw_quadruped.yaml'
    params = {'use_sim_time': False, 'autostart': False, 'require_verification': False,
              'stand_up_s': 0.2, 'fade_in_s': 0.2, 'publish_gains': True,
              'stale_after_periods': 10.0, 'model_path': str(args.model.resolve()),
              'controllers_file': str(controllers)}
    bench = Robot(robot)
    results = {}
    proc = start_node(env, ROOT, params, tmp / 'policy.log')
    try:
        wait_answers(bench)
        results['PASSIVE'] = (bench.run(args.samples, robot.control_dt),
                              node_latency(bench, 'policy_node'))
        for name in ('stand_up', 'rl'):
            for _ in range(200):
                ok, message = bench.trigger(name)
                if ok:
                    break
                bench.run(5, robot.control_dt)
            if not ok:
                raise SystemExit(f'{name} refused: {message}')
        bench.run(20, robot.control_dt)  # past the fade-in
        results['RL'] = (bench.run(args.samples, robot.control_dt),
                         node_latency(bench, 'policy_node'))
    finally:
        stop(proc)
    if args.baseline:
        base_env = {**env, 'PYTHONPATH': str(args.baseline.resolve())}
        proc = start_node(base_env, args.baseline, {
            'use_sim_time': False, 'model_path': str(args.model.resolve()),
            'stale_after_periods': 10.0}, tmp / 'baseline.log')
        try:
            wait_answers(bench)
            results['baseline RL'] = (bench.run(args.samples, robot.control_dt),
                                      node_latency(bench, 'policy_node'))
        finally:
            stop(proc)
    bench.close()
    ref = pct(results['RL'][0])
    print(f'deploy path /joint_states -> command, {args.samples} states at 50 Hz, model '
          f'{args.model.name}')
    print(f'{"":12s} {"round trip p50":>15s} {"p99":>8s} {"answered":>9s} {"node p50":>9s} '
          f'{"node p99":>9s} {"p50 / RL":>9s}')
    summary = {}
    for key, (lat, (n50, n99)) in results.items():
        p50, p99 = pct(lat)
        summary[key] = {'p50_ms': p50, 'p99_ms': p99, 'answered': len(lat),
                        'node_p50_ms': n50, 'node_p99_ms': n99}
        print(f'{key:12s} {p50:15.3f} {p99:8.3f} {len(lat):9d} {n50:>9s} {n99:>9s} '
              f'{p50 / ref[0]:9.2f}')
    print(json.dumps(summary))


if __name__ == '__main__':
    main()
