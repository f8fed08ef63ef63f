"""Lockstep sim_node + policy_node on wall-clock stamps (publish_clock false, no sim time)."""

from diagnostic_msgs.msg import DiagnosticArray

from control_models import good_model
from ros_helpers import NodeProcess, stop_all
from test_nodes_loop import status


def test_lockstep_on_wall_clock_stamps_starts_when_the_policy_joins_late(
        ros_env, probe, robot, tmp_path):
    """The state re-sent to a policy that joined late is stamped anew: with its first stamp
    the policy drops it as stale every time, and the loop never takes its first step."""
    probe.subscribe('/diagnostics', DiagnosticArray, 100)
    sim = NodeProcess('sim_node', ros_env, tmp_path, {
        'mode': 'lockstep', 'publish_clock': False, 'command_timeout_s': 0.1,
        'diagnostics_period_s': 0.1})
    # Unanswered three times: its first stamp is older than the policy's stale limit (60 ms).
    status(probe, 'sim_node', lambda v: int(v['dropped_unanswered']) >= 3, timeout=30)
    policy = NodeProcess('policy_node', ros_env, tmp_path, {
        'model_path': str(good_model(robot, tmp_path / 'w.onnx'))})
    running = status(probe, 'sim_node', lambda v: int(v['steps']) >= 50, timeout=30)
    assert running['mode'] == 'lockstep'
    assert stop_all(policy, sim) == {'policy_node': 0, 'sim_node': 0}, sim.log + policy.log
