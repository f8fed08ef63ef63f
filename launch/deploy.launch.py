"""The policy node alone on a real robot driven by ros2_control (docs/deploy.md).

    ros2 launch claw_rl_ros deploy.launch.py model:=student.onnx \
        imu_topic:=/imu_sensor_broadcaster/imu command_topic:=/forward_position_controller/commands

A student trained on a robot overlay (claw-rl train --robot-overlay) needs the same file:
``robot_overlay:=runs/<run>/robot_overlay.yaml``.

Thin: the nodes, names, parameters and arguments come from claw_rl_ros.launch_graph (graph
'deploy'), the description `claw-rl up deploy` runs too.
"""

from claw_rl_ros.launch_graph.ros_launch import generate_launch_description as describe


def generate_launch_description():
    return describe('deploy')
