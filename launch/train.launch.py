"""Live training: trainer_node learning from N batched actor_nodes and pushing each new student
back to them, and to the control loop's policy node (sim_node + policy_node in realtime),
through the policy node's hot-swap mechanism.

    ros2 launch claw_rl_ros train.launch.py actors:=2 num_envs:=64 run_dir:=runs/live

With ``control_actor:=true`` the control loop is an actor too: the policy node samples around
its mean and sim_node publishes the loop's rollout chunks next to the batched actors'.

``robot_overlay:=fit.yaml`` trains on the robot with an overlay merged (claw-rl sysid's
identified gains, joint friction, damping, rotor inertia and delay): trainer, actors and the
control loop get it.

Thin: the nodes, names, parameters and arguments come from claw_rl_ros.launch_graph (graph
'train'), the description `claw-rl up train` runs too.
"""

from claw_rl_ros.launch_graph.ros_launch import generate_launch_description as describe


def generate_launch_description():
    return describe('train')
