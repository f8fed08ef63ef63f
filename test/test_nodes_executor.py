"""The executor parameter of the nodes: rclpy's EventsExecutor (sim_node and policy_node
default) and the SingleThreadedExecutor fallback both run the lockstep loop and stop cleanly on
SIGINT; an unknown executor is refused by name."""

import pytest
from rosgraph_msgs.msg import Clock

from claw_rl_ros.core.deploy.node_config import EXECUTORS
from claw_rl_ros.nodes.ros_io import SENSOR_QOS, to_sec
from control_models import good_model
from ros_helpers import NodeProcess, probe, ros_env, stop_all  # noqa: F401 - fixtures


@pytest.mark.parametrize('executor', EXECUTORS)
def test_lockstep_loop_runs_and_stops_with_each_executor(executor, ros_env, probe, robot,
                                                         tmp_path):  # noqa: F811
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


def test_unknown_executor_is_refused(ros_env, tmp_path):  # noqa: F811
    proc = NodeProcess('policy_node', ros_env, tmp_path, {'executor': 'multi_threaded'})
    assert proc.wait_exit(timeout=30) == 1
    proc.stop()
    assert "executor = 'multi_threaded'; use one of ('events', 'single_threaded')" in proc.log
