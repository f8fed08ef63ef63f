"""policy_node alone, for a simulator or robot that is already running.

    ros2 launch claw_rl_ros policy.launch.py model:=student.onnx use_sim_time:=false

Thin: the nodes, names, parameters and arguments come from claw_rl_ros.launch_graph (graph
'policy'), the description `claw-rl up policy` runs too.
"""

from claw_rl_ros.launch_graph.ros_launch import generate_launch_description as describe


def generate_launch_description():
    return describe('policy')
