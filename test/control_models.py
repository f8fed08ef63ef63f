"""ONNX models for the control-loop tests: good ones (random weights) and each kind of bad one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, TensorProto
import torch

from claw_rl_ros.core.export.onnx_export import export_onnx
from claw_rl_ros.core.learning.networks import ActorCritic
from claw_rl_ros.core.sim.robot_spec import METADATA_KEY, RobotSpec


def good_model(robot: RobotSpec, path: Path, seed: int = 0, hidden=(64, 64)) -> Path:
    """A freshly initialised student (seeded weights) exported for ``robot``."""
    torch.manual_seed(seed)
    obs_dim = robot.policy_obs.dim
    policy = ActorCritic(obs_dim, obs_dim + robot.privileged_obs.dim, robot.num_joints,
                         actor_hidden_dims=list(hidden), critic_hidden_dims=[16],
                         actor_obs_groups=['policy'])
    # Larger last-layer weights so different seeds give clearly different actions.
    with torch.no_grad():
        last = [m for m in policy.actor.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.weight.mul_(3.0)
    return export_onnx(policy, robot, path)


def wrong_spec_model(robot: RobotSpec, path: Path) -> Path:
    """A valid model exported for the same robot with a different action scale and gains."""
    other = dataclasses.replace(robot, action_scale=robot.action_scale * 2, kp=robot.kp + 5.0)
    return good_model(other, path, seed=3)


def _linear_model(robot: RobotSpec, path: Path, obs_dim: int, weight: float,
                  action_clip: object = 10.0) -> Path:
    """actions = obs @ W with W filled with ``weight`` (no clip in the graph); the robot's own
    spec metadata with ``action_clip`` (None: left out, as models exported before it)."""
    w = np.full((obs_dim, robot.num_joints), weight, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node('MatMul', ['obs', 'W'], ['actions'])], 'linear',
        [helper.make_tensor_value_info('obs', TensorProto.FLOAT, ['batch', obs_dim])],
        [helper.make_tensor_value_info('actions', TensorProto.FLOAT,
                                       ['batch', robot.num_joints])],
        [helper.make_tensor('W', TensorProto.FLOAT, w.shape, w.flatten().tolist())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)])
    model.ir_version = 8
    entry = model.metadata_props.add()
    spec = robot.to_metadata()
    if action_clip is not None:
        spec['action_clip'] = action_clip
    entry.key, entry.value = METADATA_KEY, json.dumps(spec)
    path.write_bytes(model.SerializeToString())
    onnx.checker.check_model(str(path))
    return path


def wrong_shape_model(robot: RobotSpec, path: Path) -> Path:
    """The robot's spec metadata, but an ``obs`` input 5 values too wide."""
    return _linear_model(robot, path, robot.policy_obs.dim + 5, 0.01)


def nan_model(robot: RobotSpec, path: Path) -> Path:
    """Right spec and shapes, NaN weights: the probe run must catch it."""
    return _linear_model(robot, path, robot.policy_obs.dim, float('nan'))


def clip_model(robot: RobotSpec, path: Path, action_clip: object,
               weight: float = 0.01) -> Path:
    """Right spec and shapes with the given ``action_clip`` metadata (None: none)."""
    return _linear_model(robot, path, robot.policy_obs.dim, weight, action_clip)


def corrupted_model(robot: RobotSpec, path: Path, good: Path) -> Path:
    """A good model's bytes cut in half with a few bytes flipped."""
    data = bytearray(good.read_bytes()[: good.stat().st_size // 2])
    data[10:20] = b'\xff' * 10
    path.write_bytes(bytes(data))
    return path
