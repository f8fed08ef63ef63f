"""Hold the claw quadruped's default pose in simulation and print a summary.

    ros2 launch claw_rl_ros stand.launch.py seconds:=5.0
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument('seconds', default_value='5.0', description='simulated seconds'),
        DeclareLaunchArgument('robot', default_value='claw_quadruped',
                              description='robot name (config/robots/<name>.yaml)'),
        Node(package='claw_rl_ros', executable='claw_rl', name='stand', output='screen',
             arguments=['stand', '--robot', LaunchConfiguration('robot'),
                        '--seconds', LaunchConfiguration('seconds')]),
    ])
