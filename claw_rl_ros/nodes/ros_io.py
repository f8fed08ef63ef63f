"""Shared ROS glue for the nodes: QoS profiles, time and message <-> numpy helpers, main()."""

from __future__ import annotations

import array
import faulthandler
import gc
import inspect
import signal
import sys
from typing import Callable, Mapping, Sequence

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
import numpy as np
import rclpy
from rclpy.clock import Clock, ClockType
from rclpy.event_handler import PublisherEventCallbacks
from rclpy.executors import ExternalShutdownException
from rclpy.experimental import EventsExecutor
from rclpy.node import Node
from rclpy.signals import uninstall_signal_handlers
from rclpy.task import Future
from std_msgs.msg import Header
from rclpy.qos import (DurabilityPolicy, HistoryPolicy, qos_profile_sensor_data, QoSProfile,
                       ReliabilityPolicy)

from ..core.io import exit_without_teardown  # noqa: F401 - the nodes import it from here

# High-rate state: best effort, keep last 5 (REP-2003 sensor data). Subscribers use it: a
# best-effort subscription reads reliable and best-effort publishers alike.
SENSOR_QOS = qos_profile_sensor_data
# Commands as ros2_control's forward_command_controller subscribes to them (reliable).
COMMAND_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
# The sim's published state as ros2_control's joint_state_broadcaster offers it (reliable,
# keep last 10): a subscriber written the usual way (depth 10, reliable) receives it.
RELIABLE_STATE_QOS = COMMAND_QOS
# A state (model version, safety state) or the model bytes: reliable, transient local, keep
# last 1, published by one node per topic. A late joiner gets exactly the newest value (with
# depth 4 ``ros2 topic echo --once`` printed the oldest of four); the newest model bytes are
# the ones a trainer activates.
STATE_QOS = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST,
                       reliability=ReliabilityPolicy.RELIABLE,
                       durability=DurabilityPolicy.TRANSIENT_LOCAL)
LATCHED_QOS = STATE_QOS  # the older name, kept for importers
# The EventsExecutor spins in slices: in rclpy 9.1 its spin() without a timeout busy-waits
# (a core at 100 %) and never returns to Python, so Ctrl-C was never seen. Between slices the
# loop looks at the Ctrl-C flag: a stop within a slice, and no KeyboardInterrupt raised inside
# a callback (the EventsExecutor logs those as a FATAL callback exception).
SPIN_SLICE_S = 0.1
# The clock of every /diagnostics stamp (see diagnostics()).
WALL_CLOCK = Clock(clock_type=ClockType.SYSTEM_TIME)
# The signature of every timer callback (presigned): no arguments, so no TimerInfo.
NO_ARGUMENTS = inspect.Signature()
LEVELS = {'ok': DiagnosticStatus.OK, 'warn': DiagnosticStatus.WARN,
          'error': DiagnosticStatus.ERROR}


def to_sec(stamp: Time) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def to_stamp(seconds: float) -> Time:
    ns = int(round(seconds * 1e9))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def now_sec(node: Node) -> float:
    """The node's ROS time (sim time under use_sim_time) in seconds."""
    return node.get_clock().now().nanoseconds * 1e-9


def doubles(values: np.ndarray) -> array.array:
    """A float64[] message field from a numpy array without a Python list."""
    return array.array('d', np.ascontiguousarray(values, dtype=np.float64).tobytes())


def publisher(node: Node, msg_type: type, topic: str, qos: QoSProfile | int):
    """A publisher without QoS-event handlers.

    rclpy's executor rebuilds its wait set on every spin, and a publisher's default event
    handlers add ~8 us there, paid for every message the node receives. Incompatible QoS is
    still reported by the subscribers (ours keep their handlers).
    """
    return node.create_publisher(msg_type, topic, qos, event_callbacks=PublisherEventCallbacks(
        use_default_callbacks=False))


def take_queued(subscription) -> list:
    """The messages already waiting on ``subscription`` behind the one being handled, oldest
    first (taken now: the executor finds nothing left for them)."""
    out, handle = [], subscription.handle
    with handle:
        while (taken := handle.take_message(subscription.msg_type, subscription.raw)):
            out.append(taken[0])
    return out


def presigned(callback: Callable[[], None]) -> Callable[[], None]:
    """``callback`` as a timer's callback whose signature is known in advance.

    rclpy's executors (the EventsExecutor and the Python ones) call ``inspect.signature`` on a
    timer's callback at every firing, to hand a ``TimerInfo`` to a callback that asks for one.
    For a bound method that takes ~8 us back to back and ~0.16 ms after 5 ms idle (the policy
    node's watchdog runs 4 times a control period, and its own work after idle is ~0.03 ms);
    a callable that carries ``__signature__`` is answered in ~1 us.
    """
    def call() -> None:
        callback()
    call.__signature__ = NO_ARGUMENTS
    return call


def steady_timer(node: Node, period: float, callback: Callable[[], None]):
    """A timer on the monotonic clock: wall-paced even under use_sim_time."""
    return node.create_timer(period, presigned(callback),
                             clock=Clock(clock_type=ClockType.STEADY_TIME))


def diagnostics(node: Node, name: str, level: str, message: str,
                fields: Mapping[str, object]) -> DiagnosticArray:
    """One DiagnosticStatus (hardware_id = node name) holding ``fields`` as key/values.

    Stamped with wall time whatever the node's ``use_sim_time``: every node's messages on the
    shared ``/diagnostics`` topic carry the same clock (node clocks mixed sim and wall time), and
    the reports are wall-paced (steady timers) anyway.
    """
    def text(v: object) -> str:
        return f'{v:.4g}' if isinstance(v, float) else str(v)
    status = DiagnosticStatus(level=LEVELS[level], name=f'{node.get_name()}: {name}',
                              message=message, hardware_id=node.get_fully_qualified_name(),
                              values=[KeyValue(key=k, value=text(v)) for k, v in fields.items()])
    return DiagnosticArray(header=Header(stamp=WALL_CLOCK.now().to_msg()), status=[status])


def log_events(node: Node, events: list[tuple[str, str]]) -> None:
    """Log ``(level, text)`` events, level ``'info'`` or ``'warn'``."""
    for level, text in events:
        if level == 'warn':  # (one severity per logger call site: rclpy refuses a change)
            node.get_logger().warning(text)
        else:
            node.get_logger().info(text)


def spin(make_node: Callable[[], Node], args: list[str] | None = None) -> int:
    """``rclpy.init(args)``, spin the node, clean shutdown on Ctrl-C; exit code 1 on refusal.

    The node's ``executor`` parameter (declared with its others, node_params.py) picks one of
    :data:`~..core.params.node_config.EXECUTORS`.
    """
    return spin_nodes([make_node], args)


def spin_nodes(factories: Sequence[Callable[[], Node]], args: list[str] | None = None,
               kind: str | None = None) -> int:
    """:func:`spin` for the nodes ``factories`` make, in one process on one executor (``kind``,
    else the first node's ``executor`` parameter); exit code 1 if one refuses to start."""
    interrupted: list[int] = []
    chosen = [kind or '']
    # A native crash (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL in MuJoCo, onnxruntime, torch or
    # the DDS) prints every Python thread's stack on stderr before the process dies: the
    # launcher's log then names the callback and the library call, not only the signal.
    faulthandler.enable(file=sys.stderr, all_threads=True)

    def on_sigint(signum, frame):
        interrupted.append(signum)
        if chosen[0] != 'events':  # the events loop polls the flag instead
            signal.default_int_handler(signum, frame)

    # Installed before rclpy.init, so rclpy's own handler still runs first and chains to it.
    signal.signal(signal.SIGINT, on_sigint)
    rclpy.init(args=args)
    nodes: list[Node] = []
    try:
        for make_node in factories:
            nodes.append(make_node())
        chosen[0] = kind or nodes[0].get_parameter('executor').value  # one of EXECUTORS
    except (ValueError, RuntimeError) as exc:
        print(f'[FATAL] refusing to start: {exc}', file=sys.stderr, flush=True)
        for node in reversed(nodes):
            node.destroy_node()
        rclpy.try_shutdown()
        return 1
    # Start-up objects (models, MuJoCo, message types) move out of the collector's sight:
    # full collections no longer walk them in the middle of a control tick.
    gc.collect()
    gc.freeze()
    try:
        if chosen[0] == 'events':
            # rclpy's SIGINT and SIGTERM handlers shut the context down from another thread,
            # under a running callback (its publish fails, logged as FATAL; nodes in one
            # process that answer each other are always in one): here both only set the flag,
            # and the context goes down after the last callback.
            uninstall_signal_handlers()
            signal.signal(signal.SIGTERM, lambda signum, frame: interrupted.append(signum))
            spin_events(nodes, interrupted)
        else:  # rclpy.spin for any number of nodes (on the global executor, as it does)
            executor = rclpy.get_global_executor()
            for node in nodes:
                executor.add_node(node)
            executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:  # noqa: BLE001 - judged by whether the context was already shut down
        if rclpy.ok() and not interrupted:
            raise
        # Ctrl-C shut the context down while a callback was publishing (rclpy raises
        # RuntimeError or pybind11's TypeError then), or its KeyboardInterrupt surfaced inside
        # pybind11 while a large message was being taken ("Unable to convert call argument"):
        # a clean stop.
    finally:
        for node in reversed(nodes):
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


def spin_events(nodes: Sequence[Node], interrupted: list) -> None:
    """Spin ``nodes`` with rclpy's EventsExecutor until their context shuts down or
    ``interrupted`` (the Ctrl-C flag) is set."""
    context = nodes[0].context
    executor = EventsExecutor(context=context)
    for node in nodes:
        executor.add_node(node)
    stop = Future()
    # A slice does not end while callbacks keep coming (nodes in one process that answer each
    # other, as a lockstep loop does, never leave the executor idle): a timer looks at the flag.
    steady_timer(nodes[0], SPIN_SLICE_S,
                 lambda: None if stop.done() or not interrupted else stop.set_result(True))
    try:
        while context.ok() and not interrupted:
            executor.spin_until_future_complete(stop, SPIN_SLICE_S)
    finally:
        executor.shutdown()
