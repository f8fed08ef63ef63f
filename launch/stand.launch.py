"""Hold the robot's default pose in simulation and print a summary (one-shot).

    ros2 launch claw_rl_ros stand.launch.py seconds:=5.0 robot:=claw_quadruped

Thin: the nodes, names, parameters and arguments come from claw_rl_ros.launch_graph (graph
'stand'), the description `claw-rl up stand` runs too.
"""

from claw_rl_ros.launch_graph.ros_launch import generate_launch_description as describe


def generate_launch_description():
    return describe('stand')
