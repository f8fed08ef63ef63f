"""sim_node alone: joint_states, imu, odom and /clock out, joint_commands and cmd_vel in.

    ros2 launch claw_rl_ros sim.launch.py mode:=lockstep namespace:=robot1

Thin: the nodes, names, parameters and arguments come from claw_rl_ros.launch_graph (graph
'sim'), the description `claw-rl up sim` runs too.
"""

from claw_rl_ros.launch_graph.ros_launch import generate_launch_description as describe


def generate_launch_description():
    return describe('sim')
