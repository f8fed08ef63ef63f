"""The executor parameter of the nodes: rclpy's EventsExecutor (sim_node and policy_node
default) and the SingleThreadedExecutor fallback both run the lockstep loop and stop cleanly on
SIGINT; an unknown executor is refused by name; neither re-inspects the nodes' timer callbacks
at each firing."""

import ast
import inspect
from pathlib import Path

import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.experimental import EventsExecutor
from rclpy.task import Future
from rosgraph_msgs.msg import Clock

from claw_rl_ros.core.params.node_config import EXECUTORS
from claw_rl_ros.nodes.ros_io import NO_ARGUMENTS, SENSOR_QOS, steady_timer, to_sec
from control_models import good_model
from ros_helpers import NodeProcess, stop_all


@pytest.mark.parametrize('executor', EXECUTORS)
def test_lockstep_loop_runs_and_stops_with_each_executor(executor, ros_env, probe, robot,
                                                         tmp_path):
    if '/clock' not in probe.messages:
        probe.subscribe('/clock', Clock, SENSOR_QOS)
    start = probe.count('/clock')
    params = {'executor': executor}
    sim = NodeProcess('sim_node', ros_env, tmp_path, {'mode': 'lockstep',
                                                      'command_timeout_s': 0.2, **params})
    policy = NodeProcess('policy_node', ros_env, tmp_path, {
        'use_sim_time': True, 'model_path': str(good_model(robot, tmp_path / 'a.onnx')),
        **params})
    try:
        # Lockstep only moves on when the policy answers: 100 control periods of sim time.
        first = to_sec(probe.wait_for('/clock', start=start, timeout=30).clock)
        probe.wait_for('/clock', lambda m: to_sec(m.clock) >= first + 100 * robot.control_dt,
                       timeout=30, start=start)
    finally:
        codes = stop_all(policy, sim)
    # 0 = stopped by SIGINT (a SIGTERM after the 5 s grace would give -15).
    assert codes == {'policy_node': 0, 'sim_node': 0}, sim.log + policy.log
    assert 'Traceback' not in sim.log + policy.log


def test_unknown_executor_is_refused(ros_env, tmp_path):
    proc = NodeProcess('policy_node', ros_env, tmp_path, {'executor': 'multi_threaded'})
    assert proc.wait_exit(timeout=30) == 1
    proc.stop()
    assert "executor = 'multi_threaded'; use one of ('events', 'single_threaded')" in proc.log


@pytest.mark.parametrize('executor', [EventsExecutor, SingleThreadedExecutor])
def test_timer_callbacks_carry_their_signature(executor, ros_env, monkeypatch):
    # rclpy's executors look up a timer callback's signature at every firing (the watchdog's
    # bound method took ~0.16 ms to inspect after idle): the nodes' timers answer at once.
    asked = []

    def spy(obj, *args, **kwargs):
        asked.append(signature(obj, *args, **kwargs))
        return asked[-1]
    signature = inspect.signature
    monkeypatch.setattr(inspect, 'signature', spy)  # before the executor looks it up

    class Watchdog:
        fired = 0

        def on_timer(self):
            self.fired += 1
            if self.fired == 20:
                done.set_result(True)
    context, watchdog, done = rclpy.Context(), Watchdog(), Future()
    rclpy.init(context=context)
    try:
        node = rclpy.create_node('timer_signature', context=context)
        steady_timer(node, 0.001, watchdog.on_timer)
        spinner = executor(context=context)
        spinner.add_node(node)
        spinner.spin_until_future_complete(done, timeout_sec=30.0)
        spinner.shutdown()
        node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)
    assert watchdog.fired >= 20
    assert asked, 'rclpy no longer inspects timer callbacks: ros_io.presigned can go'
    assert all(sig is NO_ARGUMENTS for sig in asked)


def test_every_timer_of_the_package_is_presigned():
    package = Path(__file__).resolve().parents[1] / 'claw_rl_ros'
    timers = [(path.name, call) for path in package.rglob('*.py')
              for call in ast.walk(ast.parse(path.read_text()))
              if isinstance(call, ast.Call) and getattr(call.func, 'attr', '') == 'create_timer']
    assert len(timers) >= 3  # steady_timer (the verify driver's too), the actor, the trainer
    for name, call in timers:
        callback = call.args[1]
        assert isinstance(callback, ast.Call) and getattr(callback.func, 'id', '') == \
            'presigned', f'{name}:{call.lineno}: a timer callback not wrapped in presigned()'
