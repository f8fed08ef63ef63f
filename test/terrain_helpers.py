"""Shared set-up of the terrain contact tests: the standing robot dropped onto a tile."""

import mujoco

from claw_rl_ros.core.sim.scene import standing_qpos


def drop_standing(model, robot, terrain, x):
    """MjData of ``model`` with the robot in its standing pose at (x, 0.1) m from the map's
    first tile's centre, on the highest ground under it, the actuators holding the default pose.
    """
    data = mujoco.MjData(model)
    qpos = standing_qpos(model, robot)
    xy = terrain.tile_origins[0, 0, :2] + [x, 0.1]
    qpos[0:2] = xy
    qpos[2] += terrain.ground_under(xy[None])[0]
    data.qpos[:] = qpos
    data.ctrl[:] = robot.default_joint_pos
    return data
