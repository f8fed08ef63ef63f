"""ament_python package setup: installs the same layout for colcon and for a plain pip install."""
from glob import glob
import os

from setuptools import find_packages, setup

package_name = 'claw_rl_ros'


def tree(folder):
    """List (install_dir, [files]) pairs for every file below folder, keeping sub-folders."""
    pairs = {}
    for path in sorted(glob(os.path.join(folder, '**', '*'), recursive=True)):
        if os.path.isfile(path) and '__pycache__' not in path:
            target = os.path.join('share', package_name, os.path.dirname(path))
            pairs.setdefault(target, []).append(path)
    return sorted(pairs.items())


setup(
    name=package_name,
    version='0.1.0',
    packages=find_packages(exclude=['test', 'test.*', 'bench', 'bench.*']),
    data_files=[
        ('share/ament_index/resource_index/packages', ['resource/' + package_name]),
        ('share/' + package_name, ['package.xml']),
        # pip ignores setup.cfg's install_scripts: these launchers put the ROS executables in
        # <prefix>/lib/claw_rl_ros for both installs (colcon writes the same names there too).
        ('lib/' + package_name, sorted(glob('scripts/*'))),
        *tree('launch'),
        *tree('config'),
        *tree('urdf'),
    ],
    install_requires=['setuptools'],
    zip_safe=False,
    maintainer='claw_rl_ros developers',
    maintainer_email='dev@claw-rl.invalid',
    description='RL locomotion (PPO + online policy distillation) for a claw-foot quadruped.',
    license='Apache-2.0',
    tests_require=['pytest'],
    entry_points={
        'console_scripts': [
            'claw-rl = claw_rl_ros.cli:main',
            # The nodes under their own names in a venv's bin/ (lib/claw_rl_ros has sim_node,
            # policy_node, actor_node and trainer_node from scripts/ for ros2 run / launch).
            'claw-rl-sim-node = claw_rl_ros.nodes.sim.sim_node:main',
            'claw-rl-policy-node = claw_rl_ros.nodes.policy.policy_node:main',
            'claw-rl-actor-node = claw_rl_ros.nodes.actor_node:main',
            'claw-rl-trainer-node = claw_rl_ros.nodes.trainer_node:main',
            'claw-rl-recorder-node = claw_rl_ros.nodes.recorder_node:main',
            'claw-rl-node-container = claw_rl_ros.nodes.node_container:main',
        ],
    },
)
