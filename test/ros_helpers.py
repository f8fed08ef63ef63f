"""Helpers for tests with real ROS 2 processes on loopback DDS (their fixtures ``ros_env`` and
``probe`` are in conftest.py).

* :class:`NodeProcess`: ``python -m claw_rl_ros.nodes.<node> --ros-args -p k:=v ...``; stopped
  with SIGINT, then SIGTERM, then SIGKILL; its output is kept in a log file.
* :class:`Probe` (the module fixture ``probe``): an rclpy node of the test, spun in a thread, that
  records messages per topic and waits on them (or service replies) with timeouts.
"""

from __future__ import annotations

from pathlib import Path
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import pytest
import rclpy
from rclpy.context import Context
from rclpy.event_handler import PublisherEventCallbacks
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rcl_interfaces.srv import SetParameters

from claw_rl_ros.launch_graph.description import EXECUTABLES

ROOT = Path(__file__).resolve().parents[1]
# Every NodeProcess not stopped yet: the ros_env fixture stops them at the end of a module.
_STARTED: list['NodeProcess'] = []


def ros_value(value: Any) -> str:
    """A parameter value as ``--ros-args -p name:=value`` expects it (YAML)."""
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, (list, tuple)):
        return '[' + ', '.join(ros_value(v) for v in value) + ']'
    if isinstance(value, str):
        return f"'{value}'"
    return repr(value)


def node_module(node: str) -> str:
    """The module a node executable runs (the graph's own map: nodes live in folders)."""
    return EXECUTABLES[node]


def node_command(node: str, params: dict | None = None, remaps: list[str] = (),
                 log_level: str | None = None, logger: str = '') -> list[str]:
    """The command line of node module ``node`` with ``-p`` params, ``-r`` remaps and the
    level of logger ``logger``."""
    cmd = [sys.executable, '-m', node_module(node), '--ros-args']
    for key, value in (params or {}).items():
        cmd += ['-p', f'{key}:={ros_value(value)}']
    for remap in remaps:
        cmd += ['-r', remap]
    if log_level:
        cmd += ['--log-level', f'{logger}:={log_level}']
    return cmd


class NodeProcess:
    """A node executable in its own process; ``stop()`` returns its exit code."""

    def __init__(self, node: str, env: dict, log_dir: Path, params: dict | None = None,
                 name: str | None = None, log_level: str | None = None):
        """``log_level`` (e.g. ``debug``) for the node's own logger (named ``name``)."""
        self.name = name or node
        self.log_path = Path(log_dir) / f'{self.name}.log'
        cmd = node_command(node, params, [f'__node:={name}'] if name else [], log_level,
                           self.name)
        self._log = open(self.log_path, 'w')
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        _STARTED.append(self)

    @property
    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGINT, then SIGTERM, then SIGKILL (each after ``timeout`` / 2 s)."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(timeout=timeout / 2)
                except subprocess.TimeoutExpired:
                    continue
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        if self in _STARTED:
            _STARTED.remove(self)
        return self.proc.returncode


def stop_all(*procs: NodeProcess) -> dict[str, int]:
    """Stop every process (even if one misbehaves); returns {name: exit code}."""
    return {proc.name: proc.stop() for proc in procs}


class Probe:
    """The test's own node: records messages by topic, publishes, calls services; thread-safe."""

    def __init__(self, name: str = 'probe'):
        self.context = Context()
        rclpy.init(context=self.context)
        self.node = Node(name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._cond = threading.Condition()
        self.messages: dict[str, list[tuple[float, Any]]] = {}
        self._pubs: dict[str, Any] = {}
        self._clients: dict[tuple, Any] = {}
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            while self.context.ok():
                self.executor.spin_once(timeout_sec=0.05)
        except Exception:  # noqa: BLE001 - the context was shut down under the executor
            pass

    def subscribe(self, topic: str, msg_type, qos) -> None:
        """Record every message on ``topic`` as (time.monotonic(), msg)."""
        with self._cond:
            self.messages.setdefault(topic, [])

        def callback(msg, topic=topic):
            with self._cond:
                self.messages[topic].append((time.monotonic(), msg))
                self._cond.notify_all()
        self.node.create_subscription(msg_type, topic, callback, qos)

    def count(self, topic: str) -> int:
        with self._cond:
            return len(self.messages[topic])

    def since(self, topic: str, index: int) -> list:
        with self._cond:
            return [m for _, m in self.messages[topic][index:]]

    def wait_for(self, topic: str, predicate: Callable[[Any], bool] = lambda m: True,
                 timeout: float = 10.0, start: int = 0, fail: bool = True):
        """The first message at index >= start that satisfies predicate; on timeout the test
        fails (or None is returned with ``fail=False``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for _, msg in self.messages[topic][start:]:
                    if predicate(msg):
                        return msg
                left = deadline - time.monotonic()
                if left <= 0 and not fail:
                    return None
                if left <= 0:
                    pytest.fail(f'no matching message on {topic} within {timeout} s '
                                f'({len(self.messages[topic])} received)')
                self._cond.wait(left)

    def wait_count(self, topic: str, n: int, timeout: float = 10.0) -> list:
        """Wait until ``n`` messages have arrived on ``topic`` in total; returns them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.messages[topic]) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f'{topic}: {len(self.messages[topic])} of {n} messages within '
                                f'{timeout} s')
                self._cond.wait(left)
            return [m for _, m in self.messages[topic]]

    def publish(self, topic: str, msg, qos=10, msg_type=None) -> None:
        """Publish ``msg`` (or its bytes, as a raw publisher of ``msg_type`` may send
        anything) on ``topic``."""
        if topic not in self._pubs:
            # Matching subscribers wake wait_subscribers (an event, not polling).
            self._pubs[topic] = self.node.create_publisher(
                msg_type or type(msg), topic, qos, event_callbacks=PublisherEventCallbacks(
                    matched=lambda info: self._notify()))
        self._pubs[topic].publish(msg)

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait_subscribers(self, topic: str, n: int = 1, timeout: float = 10.0) -> None:
        """Wait until ``n`` subscribers have matched this probe's publisher on ``topic``."""
        with self._cond:
            if not self._cond.wait_for(
                    lambda: self._pubs[topic].get_subscription_count() >= n, timeout):
                pytest.fail(f'no subscriber on {topic} within {timeout} s')

    def call(self, srv_type, name: str, request, timeout: float = 10.0,
             resend_every: float | None = None):
        """Call a service and return its response (fails on timeout).

        One client per service, kept: each new client is a new DDS match, and a server may
        answer before its response writer has matched a brand-new client's reader (Fast DDS
        then drops the reply). ``resend_every`` sends the request again after that many
        seconds without a reply, for idempotent calls made just as the server appears."""
        key = (srv_type, name)
        if key not in self._clients:
            self._clients[key] = self.node.create_client(srv_type, name)
        client = self._clients[key]
        deadline = time.monotonic() + timeout
        if not client.wait_for_service(timeout_sec=timeout):
            pytest.fail(f'service {name} not available within {timeout} s')
        replied, futures = threading.Event(), []
        while True:
            futures.append(client.call_async(request))
            futures[-1].add_done_callback(lambda _: replied.set())
            left = deadline - time.monotonic()
            if replied.wait(max(0.0, min(left, resend_every or left))):
                return next(f for f in futures if f.done()).result()
            if time.monotonic() >= deadline:
                pytest.fail(f'no reply from {name} within {timeout} s')

    def set_parameter(self, node_name: str, name: str, value: Any, timeout: float = 10.0,
                      resend_every: float | None = None):
        """``<node>/set_parameters`` with one parameter; returns its SetParametersResult."""
        param = Parameter(name, value=value).to_parameter_msg()
        request = SetParameters.Request(parameters=[param])
        return self.call(SetParameters, f'{node_name}/set_parameters', request,
                         timeout, resend_every).results[0]

    def activate_model(self, node_name: str, sha: str, timeout: float = 60.0):
        """``model_sha256`` := ``sha`` on ``node_name`` once the node has the bytes: a reply
        "no model with sha256" (the latched bytes still in flight) is asked again, paced by the
        node's replies, until ``timeout``; returns the last SetParametersResult."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.set_parameter(node_name, 'model_sha256', sha, timeout=timeout)
            if 'no model with sha256' not in result.reason or time.monotonic() > deadline:
                return result

    def close(self) -> None:
        self.context.try_shutdown()
        self._thread.join(timeout=5)
        self.node.destroy_node()


def publish_state(probe: 'Probe', joint_names, stamp: float, position, velocity,
                  quat=(0.0, 0.0, 0.0, 1.0), gyro=(0.0, 0.0, 0.0)) -> None:
    """One robot tick as a driver publishes it: an ``Imu`` (ROS x, y, z, w) and a
    ``JointState`` with the same header stamp, on ``imu`` and ``joint_states`` (best effort)."""
    from sensor_msgs.msg import Imu, JointState
    from claw_rl_ros.nodes.ros_io import SENSOR_QOS, to_stamp
    imu = Imu()
    imu.header.stamp = to_stamp(stamp)
    imu.orientation.x, imu.orientation.y, imu.orientation.z, imu.orientation.w = quat
    imu.angular_velocity.x, imu.angular_velocity.y, imu.angular_velocity.z = gyro
    js = JointState(name=list(joint_names))
    js.header.stamp = imu.header.stamp
    js.position = [float(v) for v in position]
    js.velocity = [float(v) for v in velocity]
    probe.publish('imu', imu, SENSOR_QOS)
    probe.publish('joint_states', js, SENSOR_QOS)
