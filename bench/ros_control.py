"""The ROS control loop measured side by side in one run (ratios; not a test).

1. lockstep sim_node <-> policy_node control steps/s next to bare two-process rclpy
   JointState ping-pongs (both executors, and as raw bytes; same machine, same run), the same
   ping-pong with a lockstep step's messages (as messages and as bytes, the nodes' way), and
   the ceiling 1 / (the nodes' own work + the fastest bare round trip), own work timed in
   process and inside the running nodes: target >= 80 %; then the same loop with both nodes
   in one process (node_container's way: no hop between processes) against its own
   reference, a bare round trip between two nodes of one process (bytes and messages).
   ``--lockstep-only``: this part alone.
2. realtime 50 Hz for ``--seconds`` with ``--swaps`` hot swaps: joint_states -> command latency
   p50/p99 (measured by the sim node: state publish -> command arrival), missed ticks, and each
   swap's activation time (set_parameters request -> reply, and -> model_version message); then
   the same latency with the main job's student network (the walker fixture, no swaps) next
   to its reference from the same run: the step's messages alone, a ping every 20 ms between
   two idle processes (round trip p50/p99), and the policy's tick in process back to back and
   after 20 ms idle; and the executor's CPU per firing of the watchdog's timer with its callback
   inspected at each firing and presigned (ros_io). ``--realtime-only``: this last part alone.
3. hot-swap transport: serialising the model as a ``uint8[]`` message field versus a
   BYTE_ARRAY parameter (the alternative design), in this process.
4. with ``--student`` (default: the newest ``runs/*/student.onnx``, e.g. from ``make train``):
   tracking error and falls at 0.5 m/s through the realtime loop next to the in-process
   evaluation.
6. with ``--verify-gate``: ``claw-rl verify`` (10 episodes x 10 s) on ``--gate-model`` for each
   ``--gate-jobs``, with both nodes in one process (its default) and in two
   (``--processes``), its whole command's wall time (start-up, resets, shut-down included) as
   control steps/s next to the steps/s of the lockstep loop it runs (one process or two) on the
   same model, in ``--rounds`` interleaved rounds: target >= 80 %; and each run's verdict rows
   side by side.
5. with ``--qos-compare``: part 2 (no swaps) for each QoS of the sim's state (sim_node
   ``state_qos`` x policy_node ``state_qos``), in ``--rounds`` interleaved rounds, with
   ``--load`` busy processes competing for the cores; prints latency p50/p99 and missed ticks
   per setting and round.

Usage: .venv/bin/python bench/ros_control.py [--seconds 60] [--swaps 10]
       .venv/bin/python bench/ros_control.py --verify-gate --rounds 3
       .venv/bin/python bench/ros_control.py --qos-compare --seconds 30 --rounds 2 --load 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'test'))
# The newest student `make train` left in runs/ (None: the walk comparison is skipped).
STUDENT = max((ROOT / 'runs').glob('*/student.onnx'), key=lambda p: p.stat().st_mtime,
              default=None)


def ping_pong(role: str, seconds: float, executor: str, pipelined: bool,
              loop_messages: bool = False, raw: bool = False, paced: float = 0.0) -> None:
    """Child process: bare rclpy JointState ping-pong (the reference loop) on ``executor``
    (single_threaded: rclpy's default; events: the one the control nodes spin on), spun as
    the nodes spin (``spin_until_future_complete`` in 0.1 s slices: a ``spin_once`` per
    message made the EventsExecutor look half as fast as it runs in the nodes). Role ``both``:
    ping and pong as two nodes of this one process on one EventsExecutor, the reference of
    the loop with both nodes in one process (Fast DDS delivers within a process without a
    wake-up of another process).

    ``loop_messages``: the messages of a lockstep step and nothing else: ping sends /clock,
    imu and joint_states (reliable, as the sim node), pong reads /clock (use_sim_time) and imu
    and answers joint_states with a 12-double Float64MultiArray (reliable, as the policy node).

    One message in flight, as in lockstep (a new ping only after 0.1 s without an answer: a
    lost best-effort one): each ping carries its number in its stamp, the answer echoes it,
    and an answer to an older ping is not counted (a lost ping found late would otherwise keep
    two in flight and double the rate). ``pipelined``: the reference as first written, which
    published a fresh ping on every warm-up iteration and so kept several in flight (up to the
    depth-5 queues): a throughput, not a round trip. ``raw``: the messages go as their bytes (raw
    subscriptions, bytes refilled in place: what the nodes do), no message objects converted.
    ``paced``: a ping every ``paced`` seconds instead of one after each answer, as the
    realtime loop sends its states; prints the round trip's p50 / p99 instead of a rate (both
    ends idle between pings, as the nodes do at 50 Hz).
    """
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.experimental import EventsExecutor
    from rclpy.task import Future
    from claw_rl_ros.nodes.ros_io import SPIN_SLICE_S, steady_timer
    rclpy.init()
    one_process = role == 'both'
    spinner = EventsExecutor() if executor == 'events' or one_process \
        else SingleThreadedExecutor()
    if one_process:
        ping_pong_end('pong', spinner, loop_messages, raw, pipelined)
    node, count, kick, trips = ping_pong_end('ping' if one_process else role, spinner,
                                             loop_messages, raw, pipelined, paced > 0)
    never = Future()
    if role == 'pong':
        try:
            while rclpy.ok():
                spinner.spin_until_future_complete(never, SPIN_SLICE_S)
        except (KeyboardInterrupt, Exception):  # noqa: BLE001 - stopped by the parent
            pass
        return
    if one_process:  # never idle: a steady timer ends the warm-up and the count
        done, marks, t0 = Future(), [], time.monotonic()

        def sample():
            kick()
            now = time.monotonic()
            if (not marks and now - t0 > 2.0) or (marks and now - marks[0][0] > seconds):
                marks.append((now, count[0]))
            if len(marks) == 2:
                done.set_result(True)
        steady_timer(node, 0.05, sample)
        spinner.spin_until_future_complete(done, seconds + 60.0)
        (w0, c0), (w1, c1) = marks
        print(json.dumps({'round_trips_per_s': (c1 - c0) / (w1 - w0)}), flush=True)
        return spinner.shutdown()

    def spin_for(span: float) -> None:
        end = time.monotonic() + span
        while time.monotonic() < end:
            spinner.spin_until_future_complete(
                never, max(1e-3, min(SPIN_SLICE_S, end - time.monotonic())))
    while node.count_subscribers('ping') == 0:
        spinner.spin_once(timeout_sec=0.05)
    if paced:  # a ping every period, answered or not (a lost one is not timed)
        steady_timer(node, paced, kick)
        spin_for(2.0)
        trips.clear()
        spin_for(seconds)
        ms = 1e3 * np.array(trips)
        print(json.dumps({'round_trip_p50_ms': float(np.percentile(ms, 50)),
                          'round_trip_p99_ms': float(np.percentile(ms, 99)),
                          'round_trips': len(ms)}), flush=True)
        return
    if pipelined:  # a fresh ping every 1 ms of the warm-up: several in flight
        warm = node.create_timer(0.001, kick)
        spin_for(2.0)
        node.destroy_timer(warm)
    else:
        node.create_timer(0.05, kick)
        spin_for(2.0)  # warm-up
    count[0], start = 0, time.monotonic()
    spin_for(seconds)
    print(json.dumps({'round_trips_per_s': count[0] / (time.monotonic() - start)}), flush=True)


def ping_pong_end(role: str, spinner, loop_messages: bool, raw: bool, pipelined: bool,
                  paced: bool = False):
    """One end of :func:`ping_pong` as a node on ``spinner``: (node, [answers counted],
    kick: sends a ping if none is in flight, always when ``pipelined`` or ``paced``, [round
    trips in s: ``paced`` only])."""
    from rclpy.node import Node
    from rclpy.parameter import Parameter
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Imu, JointState
    from std_msgs.msg import Float64MultiArray
    from claw_rl_ros.nodes.ros_io import RELIABLE_STATE_QOS, SENSOR_QOS, to_sec, to_stamp
    node = Node(role, parameter_overrides=[Parameter('use_sim_time', value=True)]
                if loop_messages and role == 'pong' else [])
    spinner.add_node(node)
    out, inp = ('pong', 'ping') if role == 'pong' else ('ping', 'pong')
    qos = RELIABLE_STATE_QOS if loop_messages else SENSOR_QOS
    types = {'ping': JointState, 'pong': Float64MultiArray if loop_messages else JointState}
    pub = node.create_publisher(types[out], out, qos)
    names = [f'joint_{i}' for i in range(12)]
    msg = JointState(name=names, position=[0.0] * 12, velocity=[0.0] * 12, effort=[0.0] * 12)
    reply = Float64MultiArray(data=[0.0] * 12)
    count, sent, last, trips = [0], [0], [time.perf_counter()], []
    if raw:
        from claw_rl_ros.core.wire_format import (ClockWriter, Float64ArrayWriter,
                                                  header_stamp, ImuWriter,
                                                  JointStateWriter, read_float64_array)
        msg, reply = JointStateWriter(names), Float64ArrayWriter(12)

    def echoed(m) -> float:
        """The stamp [s] an answer (or, at the pong, a ping) carries."""
        if loop_messages and role == 'ping':
            return float(read_float64_array(m)[0] if raw else m.data[0])
        return header_stamp(m) if raw else to_sec(m.header.stamp)
    if loop_messages:
        if role == 'pong':
            node.create_subscription(Imu, 'imu', lambda m: None, qos, raw=raw)
        else:
            clock_pub, clock = node.create_publisher(Clock, '/clock', qos), Clock()
            imu_pub, imu = node.create_publisher(Imu, 'imu', qos), Imu()
            if raw:
                clock, imu = ClockWriter(), ImuWriter()

    def send_ping():
        # Sim time moves one control period a ping, as in lockstep; the stamp numbers it.
        sent[0] += 1
        stamp = 0.02 * sent[0]
        last[0] = time.perf_counter()  # (the paced round trip's start)
        if raw:  # (the nodes' way: bytes restamped in place)
            for m in (clock, imu, msg) if loop_messages else (msg,):
                m.set_stamp(stamp)
            if loop_messages:
                clock_pub.publish(clock.payload())
                imu_pub.publish(imu.payload())
            return pub.publish(msg.payload())
        msg.header.stamp = to_stamp(stamp)
        if loop_messages:
            imu.header.stamp = clock.clock = msg.header.stamp
            clock_pub.publish(clock)
            imu_pub.publish(imu)
        pub.publish(msg)

    def answer(m):
        if role == 'pong':
            if not loop_messages:
                return pub.publish(m)  # the echo
            reply.data[0] = echoed(m)
            return pub.publish(reply.payload() if raw else reply)
        if not pipelined and abs(echoed(m) - 0.02 * sent[0]) > 1e-6:
            return  # the answer to an older ping
        count[0] += 1
        if paced:
            return trips.append(time.perf_counter() - last[0])
        send_ping()

    def kick():  # (re-)start the ball: always when pipelined or paced, else when it was lost
        if pipelined or paced or time.perf_counter() - last[0] > 0.1:
            send_ping()
    node.create_subscription(types[inp], inp, answer, qos, raw=raw)
    return node, count, kick, trips


def timer_cost(seconds: float, rounds: int = 3) -> None:
    """Child process: the executor thread's CPU time per firing of a 5 ms steady timer running
    the policy controller's watchdog (as policy_node does, 4 times a control period), on the
    EventsExecutor, with a bound method as the callback (rclpy inspects its signature at each
    firing) and with the nodes' presigned one, in alternating rounds; prints both as JSON."""
    import rclpy
    from rclpy.clock import Clock, ClockType
    from rclpy.experimental import EventsExecutor
    from rclpy.task import Future
    from claw_rl_ros.core.control.policy_controller import PolicyController
    from claw_rl_ros.core.sim.robot import load_robot
    from claw_rl_ros.nodes.ros_io import presigned
    rclpy.init()
    ctrl = PolicyController(load_robot('claw_quadruped'))

    class Watchdog:
        fired = 0

        def on_watchdog(self) -> None:
            self.fired += 1
            ctrl.watchdog(0.0)

    def cpu_per_firing(wrap) -> float:
        node, w = rclpy.create_node('timer_cost'), Watchdog()
        node.create_timer(0.005, wrap(w.on_watchdog),
                          clock=Clock(clock_type=ClockType.STEADY_TIME))
        spinner = EventsExecutor()
        spinner.add_node(node)
        start = time.thread_time()
        spinner.spin_until_future_complete(Future(), seconds)
        cpu = time.thread_time() - start
        spinner.shutdown()
        node.destroy_node()
        return 1e3 * cpu / w.fired
    out = {'inspected_ms': [], 'presigned_ms': []}
    for _ in range(rounds):
        out['inspected_ms'].append(cpu_per_firing(lambda f: f))
        out['presigned_ms'].append(cpu_per_firing(presigned))
    print(json.dumps(out), flush=True)


def composed_lockstep(model: Path, seconds: float) -> None:
    """Child process: the lockstep loop with sim_node and policy_node in this one process on one
    EventsExecutor (the nodes' code unchanged, still talking over DDS: Fast DDS delivers
    within a process without its shared-memory transport), so the step pays no process hop.
    Prints the control steps/s over ``seconds`` after a 2 s warm-up, and the own work the nodes
    measured, as JSON. Stopped by a steady timer: a spin slice never ends while the loop is
    busy, and here it always is."""
    import rclpy
    from rclpy.experimental import EventsExecutor
    from rclpy.task import Future
    from claw_rl_ros.nodes.policy.policy_node import PolicyNode
    from claw_rl_ros.nodes.ros_io import steady_timer
    from claw_rl_ros.nodes.sim.sim_node import SimNode
    with tempfile.NamedTemporaryFile('w', suffix='.yaml', delete=False) as f:
        f.write('sim_node:\n  ros__parameters:\n    mode: lockstep\n    command_timeout_s: 0.2\n'
                'policy_node:\n  ros__parameters:\n    use_sim_time: true\n'
                f'    model_path: {json.dumps(str(model))}\n')
    rclpy.init(args=['--ros-args', '--params-file', f.name])
    os.unlink(f.name)
    sim, policy = SimNode(), PolicyNode()
    spinner = EventsExecutor()
    spinner.add_node(sim), spinner.add_node(policy)
    done, marks, t0 = Future(), [], time.monotonic()

    def sample():  # (wall, sim time) at the warm-up's end and at the end
        now = time.monotonic()
        if (not marks and now - t0 > 2.0) or (marks and now - marks[0][0] > seconds):
            marks.append((now, sim.sim.time))
        if len(marks) == 2:
            done.set_result(True)
    steady_timer(sim, 0.05, sample)
    # (With no timeout rclpy's EventsExecutor spins without running a callback, 2026-12-06.)
    spinner.spin_until_future_complete(done, seconds + 60.0)
    (w0, s0), (w1, s1) = marks
    print(json.dumps({'steps_per_s': (s1 - s0) / 0.02 / (w1 - w0),
                      'sim_ms': sim.step_cpu.summary('step_cpu')['step_cpu_p50_ms'],
                      'policy_ms': policy.tick_cpu.summary('tick_cpu')['tick_cpu_p50_ms']}),
          flush=True)
    spinner.shutdown()
    policy.destroy_node(), sim.destroy_node()
    rclpy.try_shutdown()


class Bench:
    """Starts nodes in an isolated ROS graph and watches them through a probe node."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.env = {**os.environ, 'ROS_DOMAIN_ID': str(random.SystemRandom().randint(1, 100)),
                    'ROS_AUTOMATIC_DISCOVERY_RANGE': 'LOCALHOST', 'ROS_HOME': str(workdir),
                    'ROS_LOG_DIR': str(workdir / 'log'), 'PYTHONUNBUFFERED': '1'}
        os.environ.update(self.env)
        from ros_helpers import Probe
        self.probe = Probe('bench')
        from diagnostic_msgs.msg import DiagnosticArray
        from std_msgs.msg import String
        from claw_rl_ros.nodes.ros_io import LATCHED_QOS
        self.probe.subscribe('/diagnostics', DiagnosticArray, 100)
        self.probe.subscribe('policy/model_version', String, LATCHED_QOS)

    def node(self, name: str, params: dict):
        from ros_helpers import NodeProcess
        return NodeProcess(name, self.env, self.workdir, params)

    def status(self, node: str, predicate=lambda v: True, timeout: float = 30.0) -> dict:
        def values(s):
            return {kv.key: kv.value for kv in s.values}
        start = self.probe.count('/diagnostics')
        msg = self.probe.wait_for('/diagnostics', lambda m: any(
            s.name.startswith(node) and predicate(values(s)) for s in m.status), timeout, start)
        return next(values(s) for s in msg.status if s.name.startswith(node))

    def ping_pong(self, seconds: float, executor: str = 'single_threaded',
                  pipelined: bool = False, loop_messages: bool = False,
                  raw: bool = False, one_process: bool = False, paced: float = 0.0):
        """Round trips/s of :func:`ping_pong` (with ``paced``: its p50 / p99 dict)."""
        shape = (['--loop-messages'] if loop_messages else []) + (['--raw'] if raw else []) \
            + (['--paced', str(paced)] if paced else [])
        if one_process:  # ping and pong nodes in one child process (role both)
            out = subprocess.run([sys.executable, __file__, '--role', 'both',
                                  '--lockstep-seconds', str(seconds)] + shape, env=self.env,
                                 capture_output=True, text=True, timeout=seconds + 90,
                                 check=True).stdout
            return json.loads(out.strip().splitlines()[-1])['round_trips_per_s']
        pong = subprocess.Popen([sys.executable, __file__, '--role', 'pong', '--executor',
                                 executor] + shape, env=self.env)
        try:
            out = subprocess.run([sys.executable, __file__, '--role', 'ping',
                                  '--lockstep-seconds', str(seconds), '--executor',
                                  executor] + shape
                                 + (['--pipelined'] if pipelined else []), env=self.env,
                                 capture_output=True, text=True, timeout=seconds + 60,
                                 check=True).stdout
        finally:
            pong.terminate()
            pong.wait()
        result = json.loads(out.strip().splitlines()[-1])
        return result if paced else result['round_trips_per_s']

    def lockstep(self, model: Path, seconds: float) -> tuple[float, dict]:
        """Control steps/s of the lockstep loop, and the own work the nodes measured in it
        (``sim_ms``: physics and readings, ``policy_ms``: the controller; thread CPU time)."""
        sim = self.node('sim_node', {'mode': 'lockstep', 'command_timeout_s': 0.2})
        policy = self.node('policy_node', {'use_sim_time': True, 'model_path': str(model)})
        try:
            first = self.status('sim_node', lambda v: int(v['steps']) > 100)
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                last = self.status('sim_node')
            span = float(last['sim_time_s']) - float(first['sim_time_s'])
            wall = time.monotonic() - t0
            pol = self.status('policy_node')
            return span / 0.02 / wall, {'sim_ms': float(last['step_cpu_p50_ms']),
                                        'policy_ms': float(pol['tick_cpu_p50_ms'])}
        finally:
            policy.stop(), sim.stop()

    def composed(self, model: Path, seconds: float) -> dict:
        """:func:`composed_lockstep` in a child process of this graph."""
        out = subprocess.run([sys.executable, __file__, '--role', 'composed', '--model',
                              str(model), '--lockstep-seconds', str(seconds)], env=self.env,
                             capture_output=True, text=True, timeout=seconds + 120,
                             check=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    def swap(self, path: Path) -> dict:
        from std_msgs.msg import UInt8MultiArray
        from claw_rl_ros.nodes.ros_io import LATCHED_QOS
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        sent = time.monotonic()
        self.probe.publish('policy/model', UInt8MultiArray(data=data), LATCHED_QOS)
        while True:  # retried until the bytes have arrived and been validated
            start = time.monotonic()
            result = self.probe.set_parameter('/policy_node', 'model_sha256', sha)
            replied = time.monotonic()
            if result.successful or 'no model with sha256' not in result.reason:
                break
        assert result.successful, result.reason
        seen = self.probe.wait_for('policy/model_version', lambda m: m.data == sha[:12],
                                   start=max(0, self.probe.count('policy/model_version') - 1))
        visible = time.monotonic()
        assert seen is not None
        return {'request_to_reply_ms': (replied - start) * 1e3,
                'request_to_version_ms': (visible - start) * 1e3,
                'bytes_to_version_ms': (visible - sent) * 1e3}

    def realtime(self, models: list[Path], seconds: float, swaps: int,
                 sim_qos: str = 'reliable', policy_qos: str = 'sensor_data') -> dict:
        sim = self.node('sim_node', {'mode': 'realtime', 'state_qos': sim_qos})
        policy = self.node('policy_node', {'use_sim_time': True, 'state_qos': policy_qos,
                                           'model_path': str(models[0])})
        try:  # (start-up under --load takes long)
            self.status('sim_node', lambda v: v['command_timed_out'] == 'False', timeout=180)
            start = self.status('sim_node')
            t0, results = time.monotonic(), []
            for k in range(swaps):
                while time.monotonic() - t0 < (k + 0.5) * seconds / swaps:
                    self.probe.wait_for('/diagnostics', timeout=5.0,
                                        start=self.probe.count('/diagnostics'))
                results.append(self.swap(models[(k + 1) % len(models)]))
            while time.monotonic() - t0 < seconds:
                end = self.status('sim_node')
            pol = self.status('policy_node')
        finally:
            policy.stop(), sim.stop()
        return {'sim': end, 'policy': pol, 'swaps': results,
                'missed_ticks': int(end['missed_ticks']) - int(start['missed_ticks'])}


def transport(model: Path) -> dict:
    """Serialisation time of the model bytes: uint8[] message vs BYTE_ARRAY parameter."""
    from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
    from rcl_interfaces.srv import SetParameters
    from rclpy.serialization import serialize_message
    from std_msgs.msg import UInt8MultiArray
    data = model.read_bytes()

    def timed(build):
        t = time.perf_counter()
        for _ in range(5):
            serialize_message(build())
        return (time.perf_counter() - t) / 5 * 1e3
    topic = timed(lambda: UInt8MultiArray(data=data))
    param = timed(lambda: SetParameters.Request(parameters=[Parameter(
        name='model', value=ParameterValue(type=ParameterType.PARAMETER_BYTE_ARRAY,
                                           byte_array_value=[bytes([b]) for b in data]))]))
    return {'model_bytes': len(data), 'uint8_topic_ms': topic, 'byte_array_param_ms': param}


def compute_per_step(model: Path, steps: int = 400, pause_s: float = 0.0) -> dict:
    """In-process CPU time of one control step's own work: the sim node's physics step and
    readings, and the policy node's tick (checks, observation, ONNX, targets), in ms (medians).
    ``pause_s``: the thread sleeps that long before each of the two, as each node idles
    between two realtime ticks (the realtime latency's own work)."""
    from claw_rl_ros.core.control.policy_controller import PolicyController
    from claw_rl_ros.core.sim.env_config import EnvConfig
    from claw_rl_ros.core.sim.robot import load_robot
    from claw_rl_ros.core.sim.sim_session import SimSession
    robot = load_robot('claw_quadruped')
    sim = SimSession(robot, EnvConfig(num_envs=1), randomization=False, pushes=False,
                     noise=False, seed=0, command_timeout_s=1.0)
    ctrl = PolicyController(robot)
    ctrl.load_path(model)
    names, sim_ms, policy_ms = list(robot.joint_names), [], []
    for k in range(steps):
        time.sleep(pause_s)
        t0 = time.thread_time()
        sim.step(sim.active_targets(time.perf_counter()))
        r = sim.readings()
        t1 = time.thread_time()
        if pause_s:
            time.sleep(pause_s)
            t1 = time.thread_time()
        ctrl.on_imu(r.time, (*r.imu_quat[1:], r.imu_quat[0]), r.imu_gyro, r.time)
        targets = ctrl.on_joint_state(r.time, names, r.joint_pos, r.joint_vel, r.time)
        t2 = time.thread_time()
        sim.set_targets(ctrl.order.from_output(targets), time.perf_counter())
        sim_ms.append((t1 - t0) * 1e3)
        policy_ms.append((t2 - t1) * 1e3)
    return {'sim_ms': float(np.median(sim_ms)), 'policy_ms': float(np.median(policy_ms))}


def compare_walk(bench: Bench, robot, student: Path, episodes: int, seconds: float,
                 mode: str = 'realtime') -> None:
    """Tracking error and falls at 0.5 m/s: the ROS loop vs in-process evaluation."""
    from geometry_msgs.msg import Twist
    from nav_msgs.msg import Odometry
    from std_srvs.srv import Trigger
    from claw_rl_ros.core.config import from_dict
    from claw_rl_ros.core.evaluation.evaluator import evaluate
    from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
    from claw_rl_ros.core.sim.env_config import EnvConfig
    from claw_rl_ros.nodes.ros_io import SENSOR_QOS, to_sec
    cfg = from_dict(EnvConfig, {'episode_length_s': seconds, 'randomization': {'enabled': False},
                                'noise': {'enabled': False}}, source='bench')
    offline = evaluate(OnnxPolicy(student, robot), cfg, robot, episodes=episodes,
                       command=(0.5, 0.0, 0.0))
    bench.probe.subscribe('odom', Odometry, SENSOR_QOS)
    sim = bench.node('sim_node', {'mode': mode, 'reset_on_fall': True})
    # One command per episode, as a script gives it: the cmd_vel timeout is off.
    policy = bench.node('policy_node', {'use_sim_time': True, 'model_path': str(student),
                                        'cmd_vel_timeout_s': 0.0})
    cmd = Twist()
    cmd.linear.x = 0.5
    errors, falls = [], 0
    try:
        bench.status('sim_node', lambda v: v['command_timed_out'] == 'False')
        for _ in range(episodes):
            bench.probe.publish('cmd_vel', cmd)
            bench.probe.call(Trigger, '/sim_node/reset', Trigger.Request())
            before = int(bench.status('sim_node')['falls'])
            start = bench.probe.count('odom')
            t0 = to_sec(bench.probe.wait_for('odom', start=start).header.stamp)
            bench.probe.wait_for('odom', lambda m: to_sec(m.header.stamp) > t0 + seconds,
                                 timeout=seconds * 5, start=start)
            bench.probe.publish('cmd_vel', cmd)
            after = int(bench.status('sim_node', lambda v: float(v['sim_time_s']) >
                                     t0 + seconds)['falls'])
            fell = after > before
            falls += fell
            for m in bench.probe.since('odom', start):
                if to_sec(m.header.stamp) > t0 + offline.settle_s and not fell:
                    v = m.twist.twist
                    errors.append([abs(0.5 - v.linear.x), abs(v.linear.y), abs(v.angular.z)])
    finally:
        policy.stop(), sim.stop()
    err = np.mean(errors, axis=0) if errors else [float('nan')] * 3
    print(f'walk at 0.5 m/s, {episodes} x {seconds:g} s: ROS {mode} loop tracking error vx '
          f'{err[0]:.3f} m/s, vy {err[1]:.3f}, yaw {err[2]:.3f}, falls {falls}/{episodes} | '
          f'in-process eval vx {offline.tracking_error_vx:.3f} m/s, vy '
          f'{offline.tracking_error_vy:.3f}, yaw {offline.tracking_error_yaw:.3f}, falls '
          f'{offline.falls}/{episodes}', flush=True)


def control_numbers(bench: Bench, models: list[Path], args) -> None:
    """Parts 1-3 of the module docstring, printed as they are measured."""
    if args.realtime_only:
        return student_latency(bench, args)
    moved = transport(models[0])
    pp = bench.ping_pong(args.lockstep_seconds)
    pp_events = bench.ping_pong(args.lockstep_seconds, 'events')
    pp_piped = bench.ping_pong(args.lockstep_seconds, pipelined=True)
    pp_raw = bench.ping_pong(args.lockstep_seconds, 'events', raw=True)
    pp_loop = bench.ping_pong(args.lockstep_seconds, 'events', loop_messages=True)
    pp_loop_raw = bench.ping_pong(args.lockstep_seconds, 'events', loop_messages=True, raw=True)
    ls, live = bench.lockstep(models[0], args.lockstep_seconds)
    composed = bench.composed(models[0], args.lockstep_seconds)
    one = {'bytes': bench.ping_pong(args.lockstep_seconds, raw=True, one_process=True),
           'messages': bench.ping_pong(args.lockstep_seconds, one_process=True),
           'loop': bench.ping_pong(args.lockstep_seconds, loop_messages=True, raw=True,
                                   one_process=True)}
    work = compute_per_step(models[0])
    print(f'lockstep: {ls:.0f} control steps/s vs bare rclpy ping-pong {pp:.0f} round '
          f'trips/s: {100 * ls / pp:.0f} %; the same ping-pong on the EventsExecutor the nodes '
          f'spin on: {pp_events:.0f} round trips/s ({100 * ls / pp_events:.0f} %); the first '
          f'reference (several pings in flight): {pp_piped:.0f} messages/s '
          f'({100 * ls / pp_piped:.0f} %)', flush=True)
    # A lockstep step = one round trip + the two nodes' own work, done one after the other;
    # the ceiling takes the fastest bare round trip (either executor, messages or their bytes).
    round_trip, step = 1e3 / max(pp, pp_events, pp_raw), 1e3 / ls
    print(f'  the same ping-pong as bytes (raw subscriptions, no message objects): {pp_raw:.0f}'
          f' round trips/s ({pp_raw / pp_events:.2f}x the messages)', flush=True)
    for label, rate in (('as messages', pp_loop), ('as bytes, the nodes\' way', pp_loop_raw)):
        print(f'  the messages of a lockstep step alone (/clock, imu, joint_states -> command, '
              f'reliable, EventsExecutor, no work) {label}: {rate:.0f} round trips/s = '
              f'{1e3 / rate:.3f} ms, {1e3 / rate - round_trip:+.3f} ms on the fastest bare '
              f'round trip', flush=True)
    for label, w in (('in process', work), ('inside the running nodes', live)):
        own = w['sim_ms'] + w['policy_ms']
        ceiling = 1e3 / (round_trip + own)
        print(f'  own work {label}: {own:.3f} ms (physics + readings {w["sim_ms"]:.3f}, '
              f'policy tick {w["policy_ms"]:.3f}); per step {step:.3f} ms = own + ROS '
              f'{step - own:.3f} ms against a bare round trip of {round_trip:.3f} ms; ceiling '
              f'1 / (own + round trip) = {ceiling:.0f} steps/s: lockstep at '
              f'{100 * ls / ceiling:.0f} % (target >= 80 %)', flush=True)
    # The same loop without the process hop, against its own reference: a bare round trip
    # between two nodes of one process (Fast DDS delivers in process, no other process wakes).
    c, in_process = composed['steps_per_s'], work['sim_ms'] + work['policy_ms']
    inside = composed['sim_ms'] + composed['policy_ms']
    one_trip = 1e3 / max(one['messages'], one['bytes'])
    print(f'  both nodes in one process (one EventsExecutor, still over DDS): {c:.0f} control '
          f'steps/s = {1e3 / c:.3f} ms a step, {c / ls:.2f}x the two processes. Its reference, '
          f'a bare round trip between two nodes of one process: {one["bytes"]:.0f} round '
          f'trips/s as bytes, {one["messages"]:.0f} as messages ({one_trip:.3f} ms); the '
          f'messages of a step alone as bytes in one process {1e3 / one["loop"]:.3f} ms',
          flush=True)
    for label, own in (('in process', in_process), ('inside it', inside)):
        print(f'    own work {label} {own:.3f} ms: ceiling 1 / (own + the one-process round '
              f'trip) = {1e3 / (own + one_trip):.0f} steps/s, the one-process loop at '
              f'{100 * c * (own + one_trip) / 1e3:.0f} % (target >= 80 %); against the '
              f'two-process round trip (not its own reference) '
              f'{100 * c * (own + round_trip) / 1e3:.0f} %', flush=True)
    if args.lockstep_only:
        return
    print(f'swap transport ({moved["model_bytes"]} B): uint8[] topic '
          f'{moved["uint8_topic_ms"]:.2f} ms vs BYTE_ARRAY parameter '
          f'{moved["byte_array_param_ms"]:.1f} ms to serialise '
          f'({moved["byte_array_param_ms"] / moved["uint8_topic_ms"]:.0f}x)', flush=True)
    rt = bench.realtime(models, args.seconds, args.swaps)
    sim, pol, swaps = rt['sim'], rt['policy'], rt['swaps']
    reply = [s['request_to_reply_ms'] for s in swaps]
    version = [s['request_to_version_ms'] for s in swaps]
    print(f'realtime {args.seconds:g} s at 50 Hz, {len(swaps)} swaps: joint_states -> '
          f'command latency p50 {sim["command_latency_p50_ms"]} ms, p99 '
          f'{sim["command_latency_p99_ms"]} ms (policy compute p50 '
          f'{pol["latency_p50_ms"]} ms, p99 {pol["latency_p99_ms"]} ms); missed ticks '
          f'{rt["missed_ticks"]}; swap active after request: max {max(reply):.1f} ms '
          f'(reply), max {max(version):.1f} ms (version topic), median '
          f'{np.median(version):.1f} ms; model {pol["model_version"]}', flush=True)
    student_latency(bench, args)


def student_latency(bench: Bench, args) -> None:
    """The realtime loop with the network the main job trains (128x128x128: the walker
    fixture; the swap models are 256x256x256, sized for the hot-swap payload), next to its
    reference on this machine, measured in the same run: the step's messages alone paced at
    50 Hz between two idle processes, and the policy's tick in process after an idle period."""
    student = ROOT / 'test' / 'fixtures' / 'walker.onnx'
    own = bench.realtime([student], args.seconds, 0)
    s2, p2 = own['sim'], own['policy']
    p50, p99 = float(s2['command_latency_p50_ms']), float(s2['command_latency_p99_ms'])
    print(f'realtime {args.seconds:g} s at 50 Hz with the main job\'s student network '
          f'({student.name}, 128x128x128): joint_states -> command latency p50 {p50:.3f} ms, '
          f'p99 {p99:.3f} ms (policy compute p50 {p2["latency_p50_ms"]} ms, p99 '
          f'{p2["latency_p99_ms"]} ms); missed ticks {own["missed_ticks"]}; target p50 <= 1 ms, '
          f'p99 <= 3 ms', flush=True)
    trip = bench.ping_pong(args.lockstep_seconds, 'events', loop_messages=True, raw=True,
                           paced=0.02)
    warm, idle = compute_per_step(student), compute_per_step(student, 200, 0.02)
    # What the loop adds to a bare paced round trip, next to the policy's tick as it runs then.
    print(f'  its reference: the step\'s messages alone as bytes, a ping every 20 ms between '
          f'two otherwise idle processes: round trip p50 {trip["round_trip_p50_ms"]:.3f} ms, '
          f'p99 {trip["round_trip_p99_ms"]:.3f} ms (the loop p50 '
          f'{p50 - trip["round_trip_p50_ms"]:+.3f} ms on it); the policy\'s tick (imu + joint '
          f'state) in process {warm["policy_ms"]:.3f} ms back to back, {idle["policy_ms"]:.3f} '
          f'ms after 20 ms idle ({idle["policy_ms"] / warm["policy_ms"]:.1f}x: how much of the '
          f'caches an idle period leaves is the machine\'s)', flush=True)
    out = subprocess.run([sys.executable, __file__, '--role', 'timers', '--lockstep-seconds',
                          str(args.lockstep_seconds)], env=bench.env, capture_output=True,
                         text=True, timeout=args.lockstep_seconds * 5 + 60, check=True).stdout
    cost = json.loads(out.strip().splitlines()[-1])
    inspected, signed = np.median(cost['inspected_ms']), np.median(cost['presigned_ms'])
    print(f'  the watchdog\'s 5 ms timer, executor thread CPU per firing (3 alternating rounds, '
          f'median): callback inspected at each firing {inspected:.3f} ms, presigned (the '
          f'nodes\' timers) {signed:.3f} ms ({inspected / signed:.2f}x)', flush=True)


# (sim_node state_qos = publisher, policy_node state_qos = subscriber) settings compared.
QOS_SETTINGS = (('sensor_data', 'sensor_data'), ('reliable', 'sensor_data'),
                ('reliable', 'reliable'))


def qos_compare(bench: Bench, models: list[Path], args) -> None:
    """Part 5: realtime latency and missed ticks per QoS setting, rounds interleaved."""
    burners = [subprocess.Popen([sys.executable, '-c', 'while True: pass'])
               for _ in range(args.load)]
    try:
        for k in range(args.rounds):
            for pub, sub in QOS_SETTINGS:
                rt = bench.realtime(models, args.seconds, 0, pub, sub)
                sim = rt['sim']
                print(f'round {k + 1}, load {args.load}, publisher {pub}, subscriber {sub}: '
                      f'joint_states -> command p50 {sim["command_latency_p50_ms"]} ms, p99 '
                      f'{sim["command_latency_p99_ms"]} ms, missed ticks '
                      f'{rt["missed_ticks"]} in {args.seconds:g} s, load average '
                      f'{os.getloadavg()[0]:.1f}', flush=True)
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()


def verify_gate(bench: Bench, args) -> None:
    """Part 6: the gate's wall rate against lockstep on the same model, rounds interleaved."""
    from claw_rl_ros.core.sim.robot import load_robot
    from claw_rl_ros.core.verify.gate_scoring import VerifyConfig
    from claw_rl_ros.core.config import load_config
    from claw_rl_ros.core import paths
    cfg = load_config(VerifyConfig, paths.config_path('verify.yaml'), 'verify')
    dt = load_robot().control_dt  # (the gate model's robot: the package's claw quadruped)
    domain = int(bench.env['ROS_DOMAIN_ID'])
    for k in range(args.rounds):
        # Each gate against the loop it runs: one process (the default) or two (--processes).
        loops = {'one process': bench.composed(args.gate_model,
                                               args.lockstep_seconds)['steps_per_s'],
                 'two processes': bench.lockstep(args.gate_model, args.lockstep_seconds)[0]}
        said_loops = ', '.join(f'{v:.0f} control steps/s in {n}' for n, v in loops.items())
        print(f'round {k + 1}: lockstep {said_loops} ({args.gate_model.name}, '
              f'{args.lockstep_seconds:g} s after warm-up)', flush=True)
        for jobs in args.gate_jobs:
            for mode, flag in (('one process', []), ('two processes', ['--processes'])):
                ls = loops[mode]
                model = Path(shutil.copy(args.gate_model,
                                         bench.workdir / f'gate_{k}_{jobs}_{len(flag)}.onnx'))
                start = time.monotonic()
                run = subprocess.run([sys.executable, '-m', 'claw_rl_ros.cli', 'verify',
                                      '--model', str(model), '--jobs', str(jobs), '--domain-id',
                                      str(domain + 1), *flag], env=bench.env,
                                     capture_output=True, text=True, timeout=600)
                wall = time.monotonic() - start
                name = f'verify --jobs {jobs}{" --processes" if flag else ""}'
                if not model.with_suffix('.verify.json').is_file():
                    print(f'  {name} failed (exit {run.returncode}):\n{run.stdout}'
                          f'{run.stderr}', flush=True)
                    continue
                table = {r['check']: r for r in json.loads(
                    model.with_suffix('.verify.json').read_text())['table']}
                steps = cfg.episodes * round(cfg.episode_s / dt)
                rows = ', '.join(f'{name.split(" (")[0].replace("tracking error ", "")} '
                                 f'{r["value"]:.3f}' for name, r in table.items()
                                 if name.startswith(('tracking error v', 'fall rate')))
                # Where the time went, as the gate says it: its graphs' start-up, the episodes.
                said = re.search(r'running after ([\d.]+)-([\d.]+) s, [\d,]+ steps in the '
                                 r'next ([\d.]+) s', run.stdout)
                phases = f'; graphs up after {said[1]}-{said[2]} s of it, the episodes then ' \
                    f'at {steps / float(said[3]):.0f} steps/s = ' \
                    f'{100 * steps / float(said[3]) / ls:.0f} % of lockstep' if said else ''
                print(f'  {name}: {steps} steps in {wall:.2f} s of the whole command = '
                      f'{steps / wall:.0f} steps/s = {100 * steps / wall / ls:.0f} % of lockstep '
                      f'in {mode} (target >= 80 %){phases}; exit {run.returncode}; {rows}',
                      flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--role', choices=['ping', 'pong', 'both', 'composed', 'timers'])
    parser.add_argument('--model', type=Path, help='the composed role\'s model')
    parser.add_argument('--executor', default='single_threaded',
                        choices=['single_threaded', 'events'])
    parser.add_argument('--pipelined', action='store_true')
    parser.add_argument('--loop-messages', action='store_true')
    parser.add_argument('--raw', action='store_true')
    parser.add_argument('--paced', type=float, default=0.0, help='ping period [s] (a role)')
    parser.add_argument('--seconds', type=float, default=60.0)
    parser.add_argument('--lockstep-seconds', type=float, default=10.0)
    parser.add_argument('--swaps', type=int, default=10)
    parser.add_argument('--student', type=Path, default=STUDENT)
    parser.add_argument('--walk-episodes', type=int, default=10)
    parser.add_argument('--walk-seconds', type=float, default=10.0)
    parser.add_argument('--walk-modes', nargs='+', default=['realtime'],
                        choices=['realtime', 'lockstep'])
    parser.add_argument('--only-walk', action='store_true', help='skip parts 1-3')
    parser.add_argument('--lockstep-only', action='store_true',
                        help='part 1 only (no realtime, swaps or walk)')
    parser.add_argument('--realtime-only', action='store_true',
                        help='part 2\'s student latency and its reference only')
    parser.add_argument('--qos-compare', action='store_true', help='part 5 only')
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--load', type=int, default=0, help='busy processes (part 5)')
    parser.add_argument('--verify-gate', action='store_true', help='part 6 only')
    parser.add_argument('--gate-model', type=Path, default=ROOT / 'test' / 'fixtures' /
                        'walker.onnx', help='model the gate verifies (part 6)')
    parser.add_argument('--gate-jobs', type=int, nargs='+', default=[1, 2],
                        help='claw-rl verify --jobs values compared (part 6)')
    args = parser.parse_args()
    if args.role == 'composed':
        return composed_lockstep(args.model, args.lockstep_seconds)
    if args.role == 'timers':
        return timer_cost(args.lockstep_seconds / 2)
    if args.role:
        return ping_pong(args.role, 0 if args.role == 'pong' else args.lockstep_seconds,
                         args.executor, args.pipelined, args.loop_messages, args.raw,
                         args.paced)
    from control_models import good_model
    from claw_rl_ros.core.sim.robot import load_robot
    robot = load_robot()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        models = [good_model(robot, tmp / f'{k}.onnx', seed=k, hidden=(256, 256, 256))
                  for k in range(2)]
        bench = Bench(tmp)
        print(f'machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the '
              'start (other processes compete for the same cores)', flush=True)
        if args.verify_gate:
            verify_gate(bench, args)
        elif args.qos_compare:
            qos_compare(bench, models, args)
        elif not args.only_walk:
            control_numbers(bench, models, args)
        if args.qos_compare or args.verify_gate or args.lockstep_only or args.realtime_only:
            pass
        elif args.student is not None and args.student.is_file():
            for mode in args.walk_modes:
                compare_walk(bench, robot, args.student, args.walk_episodes, args.walk_seconds,
                             mode)
        else:
            print(f'walk check skipped: {args.student} does not exist', flush=True)
        print(f'load average {os.getloadavg()[0]:.1f} at the end', flush=True)
        bench.probe.close()


if __name__ == '__main__':
    main()
