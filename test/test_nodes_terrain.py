"""sim_node on a terrain tile (real process, loopback DDS): its world stands on the tile the
generator makes for the ``terrain`` / ``terrain_seed`` parameters, and the joint states and IMU
it publishes make, step after step, the policy observation the env builds on that tile from the
same state and the same joint targets. Bad terrain parameters are refused in one line."""

from dataclasses import replace
import subprocess
import sys

from nav_msgs.msg import Odometry
import numpy as np
import pytest
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray

from claw_rl_ros.core.config import from_dict
from claw_rl_ros.core.control.state_input import imu_arrays, JointOrder, ObservationAssembler
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.sim_session import terrain_tile
from claw_rl_ros.core.sim.terrain import generate_terrain, TerrainConfig
from claw_rl_ros.core.params.node_config import SimParams
from claw_rl_ros.nodes.ros_io import COMMAND_QOS, doubles, RELIABLE_STATE_QOS, to_sec
from ros_helpers import NodeProcess, ROOT, ros_value, stop_all

STEPS = 40
TOPICS = {'joint_states': JointState, 'imu': Imu, 'odom': Odometry}


def at(probe, topic, stamp, dt, timeout=30.0):
    """The message on ``topic`` stamped ``stamp`` (+- half a control period)."""
    return probe.wait_for(topic, lambda m: abs(to_sec(m.header.stamp) - stamp) < 0.5 * dt,
                          timeout=timeout)


def node_observation(robot, assembler, js, imu):
    """What the policy node observes from the sim's messages."""
    pos, vel = JointOrder(robot).joint_arrays(js.name, js.position, js.velocity)
    o, w = imu.orientation, imu.angular_velocity
    quat, gyro = imu_arrays([o.x, o.y, o.z, o.w], [w.x, w.y, w.z])
    return assembler.observe(pos, vel, quat, gyro)


def env_on(robot, tile):
    """A 1-world env on the tile, no randomisation or noise, standing command."""
    cfg = from_dict(EnvConfig, {'num_envs': 1, 'num_threads': 1, 'randomization':
                                {'enabled': False}, 'noise': {'enabled': False}}, source='test')
    return VecLocomotionEnv(replace(cfg, terrain=tile.config), robot)


def adopt(env, robot, js, odom):
    """The env's world put in the state the sim published (at a reset: at rest)."""
    p = env.physics
    pose = odom.pose.pose
    p.state[0] = 0.0
    p.qpos[0, 0:3] = [pose.position.x, pose.position.y, pose.position.z]
    p.qpos[0, 3:7] = [pose.orientation.w, pose.orientation.x, pose.orientation.y,
                      pose.orientation.z]
    p.qpos[0, p.qadr] = JointOrder(robot).joint_arrays(js.name, js.position, js.velocity)[0]
    env.targets[0] = p.qpos[0, p.qadr]
    env.commands[0] = 0.0
    p.forward(np.array([0]), env.targets[:1])


def test_the_sim_on_a_tile_publishes_the_observation_the_env_builds_there(
        ros_env, probe, robot, tmp_path):
    tile = terrain_tile('rough:6', TerrainConfig(), 7)
    dt = robot.control_dt
    for topic, kind in TOPICS.items():
        probe.subscribe(topic, kind, RELIABLE_STATE_QOS)
    # The command publisher exists before the sim does: nothing it sent earlier can arrive.
    probe.publish('joint_commands', Float64MultiArray(), COMMAND_QOS)
    sim = NodeProcess('sim_node', ros_env, tmp_path, {
        'mode': 'lockstep', 'terrain': 'rough:6', 'terrain_seed': 7, 'command_timeout_s': 1.0})
    env = env_on(robot, tile)
    try:
        probe.wait_subscribers('joint_commands', timeout=60)
        first = probe.wait_for('joint_states', timeout=60)
        t0 = to_sec(first.header.stamp)
        odom = at(probe, 'odom', t0, dt)
        # Standing on the tile centre, on the ground of this type, level and seed.
        z0 = env.terrain.tile_origins[0, 0]
        start = odom.pose.pose.position
        assert [start.x, start.y] == pytest.approx(z0[:2], abs=1e-9)
        assert start.z == pytest.approx(z0[2] + robot.init_base_height, abs=1e-9)
        for other in ('rough:6', 'rough:9'):
            seed = 1000 if other == 'rough:6' else 7
            ground = generate_terrain(terrain_tile(other, TerrainConfig(), seed).config, robot)
            assert abs(ground.tile_origins[0, 0, 2] - z0[2]) > 1e-6, other  # not this map
        adopt(env, robot, first, odom)
        assembler = ObservationAssembler(robot)
        assembler.gait_phase[:] = env.gait_phase
        obs = env.observe()['policy'][0]
        np.testing.assert_allclose(node_observation(robot, assembler, first,
                                                    at(probe, 'imu', t0, dt)), obs, atol=1e-6)
        rng = np.random.default_rng(0)
        for k in range(1, STEPS + 1):
            action = rng.normal(0.0, 0.4, robot.num_joints)
            target = robot.action_to_target(action[None])[0]
            probe.publish('joint_commands', Float64MultiArray(data=doubles(target)),
                          COMMAND_QOS)
            assembler.advance(action)
            obs, _, terminated, truncated, _ = env.step(action[None])
            assert not terminated[0] and not truncated[0]
            js, imu = at(probe, 'joint_states', t0 + k * dt, dt), at(probe, 'imu', t0 + k * dt, dt)
            np.testing.assert_allclose(node_observation(robot, assembler, js, imu),
                                       obs['policy'][0], atol=1e-5, err_msg=f'step {k}')
        # The robot moved on the rough ground, and still stands above it.
        assert np.abs(np.asarray(js.position) - np.asarray(first.position)).max() > 0.05
        assert env.robot_state().base_height[0] > 0.7 * robot.standing_height
    finally:
        env.close()
        codes = stop_all(sim)
    assert codes == {'sim_node': 0}, sim.log
    assert 'terrain rough:6 seed 7' in sim.log


def test_sim_params_refuse_a_terrain_in_training_and_a_stalled_clock():
    with pytest.raises(ValueError, match="parameter terrain = 'rough' with training: the train "
                                         "config's env.terrain places the world"):
        SimParams(terrain='rough', training=True)
    with pytest.raises(ValueError, match='parameter real_time_factor = 0.0; use sim seconds'):
        SimParams(real_time_factor=0.0)
    assert SimParams(terrain='rough').terrain == 'rough'


def test_a_bad_terrain_parameter_is_a_one_line_refusal(ros_env, tmp_path):
    result = subprocess.run(
        [sys.executable, '-m', 'claw_rl_ros.nodes.sim.sim_node', '--ros-args', '-p',
         f'terrain:={ros_value("stairs:2")}'], cwd=ROOT, env=ros_env, capture_output=True,
        text=True, timeout=180)
    fatal = [line for line in result.stderr.splitlines() if line.startswith('[FATAL]')]
    assert result.returncode == 1 and len(fatal) == 1, result.stderr
    assert ("parameter terrain: 'stairs:2': unknown terrain type 'stairs'; use one of flat, "
            'rough, slope_up') in fatal[0]
    assert 'Traceback' not in result.stderr
