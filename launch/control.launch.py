"""The control loop: sim_node + policy_node serving an exported ONNX student.

    ros2 launch claw_rl_ros control.launch.py model:=student.onnx mode:=realtime

Thin: the nodes, names, parameters and arguments come from claw_rl_ros.launch_graph (graph
'control'), the description `claw-rl up control` runs too.
"""

from claw_rl_ros.launch_graph.ros_launch import generate_launch_description as describe


def generate_launch_description():
    return describe('control')
