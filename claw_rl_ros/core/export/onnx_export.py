"""Export the student's deterministic action to ONNX, with the normaliser and the task spec.

The graph is ``actions [batch, A] = clip(actor(normalise(obs [batch, obs_dim])), action range)``:
the student's ``act_inference`` on the ``policy`` observation group (a PPO ``ActorCritic``: the
Gaussian mean; a SAC ``SACPolicy``: ``bias + scale * tanh(mean)``, the squashed mean in the
env's action range), clipped as the env clips the actions it trained with, so every consumer of
the file gets the trained action range. The range is ``+-action_clip`` for the robot
(``env.clip_actions``) and the action space's per-dimension ``[low, high]`` for a Gymnasium task.
The metadata holds the spec the policy was trained for, a :class:`~..sim.robot.RobotSpec`
(joints, pose, gains, limits, observation layout) or a :class:`~..sim.gym_spec.GymTaskSpec`
(env id, observation and action spaces), plus ``action_clip``, which deployment checks. The file
is written only after ``onnx.checker`` and a torch/onnxruntime parity check pass, and
atomically.
"""

from __future__ import annotations

import copy
from datetime import datetime, timezone
import io
import json
from pathlib import Path
from typing import Any
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from ..config import ConfigError, to_dict
from ..io import atomic_write_bytes
from ..learning.learner import load_policy
from ..learning.networks import ActorCritic
from .onnx_policy import INPUT_NAME, OUTPUT_NAME, session_options
from ..sim.env_config import EnvConfig
from ..sim.gym_spec import gym_task_spec, GymTaskSpec
from ..sim.observations import check_history, HEIGHT_SCAN
from ..sim.robot import load_robot
from ..sim.robot_spec import METADATA_KEY, RobotSpec

EXPORT_FORMAT = 1
MIN_OPSET = 17
# onnxruntime vs torch, per unit of activation scale (see parity_errors): float32 rounding in
# a different summation order (MLAS vs MKL) grows with the values summed, so an absolute gate
# would refuse a healthy un-normalised network whose hidden units reach the hundreds.
PARITY_TOLERANCE = 1e-5
DEFAULT_ACTION_CLIP = EnvConfig().clip_actions
RESERVED_KEYS = (METADATA_KEY, 'claw_rl_format', 'exported_at', 'parity_max_abs_diff',
                 'parity_max_scaled_diff')
# The action range of the graph: +-clip on every action, or per-dimension (low [A], high [A]).
ActionClip = float | tuple[np.ndarray, np.ndarray]


class ExportError(RuntimeError):
    """The exported graph does not reproduce the torch policy."""


class _DeployedActor(nn.Module):
    """``obs [B, obs_dim] -> clip(act_inference({'policy': obs}), action range) [B, A]``."""

    def __init__(self, policy: ActorCritic, action_clip: ActionClip):
        super().__init__()
        self.policy = policy
        self.action_clip = action_clip
        if isinstance(action_clip, tuple):
            # Buffers: the bounds are constants of the traced graph.
            self.register_buffer('low', torch.as_tensor(action_clip[0], dtype=torch.float32))
            self.register_buffer('high', torch.as_tensor(action_clip[1], dtype=torch.float32))
            self.action_clip = (self.low, self.high)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return deployed_action(self.policy, obs, self.action_clip)


def deployed_action(policy: ActorCritic, obs: torch.Tensor,
                    action_clip: ActionClip) -> torch.Tensor:
    """What the exported graph computes: [B, obs_dim] -> [B, A] clipped deterministic action.

    ``action_clip`` is a float (every action within +-clip) or (low [A], high [A]) (arrays or
    tensors).
    """
    action = policy.act_inference({'policy': obs})
    if isinstance(action_clip, tuple):
        low, high = (b.to(action.dtype) if isinstance(b, torch.Tensor)
                     else torch.as_tensor(b, dtype=action.dtype) for b in action_clip)
        return torch.minimum(torch.maximum(action, low), high)
    return action.clamp(-action_clip, action_clip)


def _sizes(spec: RobotSpec | GymTaskSpec) -> tuple[int, int, str]:
    """(obs_dim, action_dim, the spec's action count in words) from its metadata."""
    meta = spec.to_metadata()
    if meta.get('kind'):
        words = f'env {spec.name!r} takes {meta["action_dim"]} actions'
    else:
        words = f'robot {spec.name!r} has {meta["action_dim"]} joints'
    return int(meta['obs_dim']), int(meta['action_dim']), words


def _check_exportable(policy: ActorCritic, spec: RobotSpec | GymTaskSpec,
                      obs_history: int) -> None:
    """Only a student reading the measurable ``policy`` group (``obs_history`` frames of the
    spec's observation) with the spec's sizes."""
    if HEIGHT_SCAN in policy.actor_obs_groups:
        raise ValueError(f'the actor reads observation group {HEIGHT_SCAN!r} (terrain heights '
                         'around the base, known only in simulation), so it cannot run on the '
                         'robot: distil a blind student (policy.actor_obs_groups: [policy]) from '
                         'this teacher with claw-rl train --teacher CHECKPOINT and export that')
    if list(policy.actor_obs_groups) != ['policy']:
        raise ValueError(f'the actor reads observation groups {policy.actor_obs_groups}; only '
                         "an actor on ['policy'] can be deployed (privileged observations do "
                         'not exist on the robot): export the student, not the teacher')
    frame_dim, action_dim, actions = _sizes(spec)
    obs = torch.zeros(1, frame_dim * obs_history)
    try:
        with torch.no_grad():
            out = policy.act_inference({'policy': obs})
    except RuntimeError as exc:
        raise ValueError(f'the actor does not accept the {spec.name!r} policy observation of '
                         f'{obs_history} frame(s) of {frame_dim} = [{frame_dim * obs_history}] '
                         f'({exc}); export with obs_history = the env.policy_history it was '
                         'trained with') from None
    if tuple(out.shape) != (1, action_dim):
        raise ValueError(f'the actor outputs {tuple(out.shape[1:])} actions, {actions}')


def _checked_clip(action_clip: ActionClip, action_dim: int) -> ActionClip:
    """A float > 0, or (low [A], high [A]) float64, finite, with low <= high."""
    if not isinstance(action_clip, tuple):
        if not action_clip > 0:
            raise ValueError(f'action_clip {action_clip!r} must be > 0 (env.clip_actions)')
        return float(action_clip)
    low, high = (np.asarray(b, dtype=np.float64).reshape(-1) for b in action_clip)
    if low.shape != (action_dim,) or high.shape != (action_dim,):
        raise ValueError(f'action_clip bounds have shapes {low.shape} and {high.shape}; the '
                         f'policy has {action_dim} actions')
    if not (np.isfinite(low).all() and np.isfinite(high).all() and (low <= high).all()):
        raise ValueError(f'action_clip bounds low {low.tolist()} high {high.tolist()} must be '
                         'finite with low <= high (the action space)')
    return low, high


def _clip_metadata(action_clip: ActionClip) -> float | dict[str, list[float]]:
    """The spec's ``action_clip``: the float, or ``{'low': [A], 'high': [A]}``."""
    if isinstance(action_clip, tuple):
        return {'low': action_clip[0].tolist(), 'high': action_clip[1].tolist()}
    return action_clip


def _graph_bytes(policy: ActorCritic, obs_dim: int, opset: int,
                 action_clip: ActionClip) -> bytes:
    """TorchScript-based export with a dynamic batch.

    torch 2.13 deprecates this exporter in favour of ``dynamo=True``, which needs the
    onnxscript package and ships its own graph rewriting; the TorchScript path is pinned here
    (``dynamo=False``) because it needs no extra dependency and every file it writes is still
    checked by ``onnx.checker`` and a 1,000-sample onnxruntime-vs-torch parity test before it
    is written, so a change of behaviour cannot reach a robot unnoticed.
    """
    module = _DeployedActor(copy.deepcopy(policy).cpu().float(), action_clip).eval()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DeprecationWarning)
        torch.onnx.export(module, (torch.zeros(1, obs_dim),), buffer,
                          input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                          dynamic_axes={INPUT_NAME: {0: 'batch'}, OUTPUT_NAME: {0: 'batch'}},
                          opset_version=opset, dynamo=False)
    return buffer.getvalue()


def _metadata(spec: RobotSpec | GymTaskSpec, extra: dict[str, Any] | None,
              action_clip: ActionClip, obs_history: int) -> dict[str, str]:
    """metadata_props: the spec (with the action clip and the observation frames the input
    holds) and format as JSON strings, plus extras (each JSON-encoded)."""
    extra = dict(extra or {})
    clash = [k for k in extra if k in RESERVED_KEYS]
    if clash:
        raise ValueError(f'extra_metadata may not set {clash}: reserved for the exporter')
    props = {METADATA_KEY: json.dumps({**spec.to_metadata(),
                                       'action_clip': _clip_metadata(action_clip),
                                       'obs_history': obs_history}),
             'claw_rl_format': str(EXPORT_FORMAT),
             'exported_at': datetime.now(timezone.utc).isoformat(timespec='seconds')}
    props.update({str(k): json.dumps(v) for k, v in extra.items()})
    return props


def _name_output_dims(model: onnx.ModelProto, action_dim: int) -> None:
    """Output ``actions`` as [batch, action_dim]: per-dimension clipping (Max/Min against [A]
    bounds) leaves the exporter's second dim symbolic, which loaders would refuse."""
    dims = model.graph.output[0].type.tensor_type.shape.dim
    dims[0].dim_param = 'batch'
    dims[1].dim_value = action_dim


def _set_metadata(model: onnx.ModelProto, props: dict[str, str]) -> None:
    existing = {p.key: p for p in model.metadata_props}
    for key, value in props.items():
        entry = existing.get(key) or model.metadata_props.add()
        entry.key, entry.value = key, value


def random_observations(obs_dim: int, num_samples: int, seed: int) -> np.ndarray:
    """[num_samples, obs_dim] float32: normal noise at per-row scales 0.3, 1 and 3."""
    rng = np.random.default_rng(seed)
    scale = rng.choice([0.3, 1.0, 3.0], size=(num_samples, 1))
    return (rng.standard_normal((num_samples, obs_dim)) * scale).astype(np.float32)


def _deployed_action_and_scale(policy: nn.Module, obs: torch.Tensor, action_clip: ActionClip
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`deployed_action` [B, A] and :func:`activation_scale` [B] in one forward pass."""
    scale = torch.ones(obs.shape[0], dtype=torch.float64)

    def record(module, inputs, output):
        for value in (inputs[0], output):
            scale.copy_(torch.maximum(scale, value.detach().abs().flatten(1).amax(-1).double()))

    hooks = [m.register_forward_hook(record) for m in policy.modules()
             if isinstance(m, (nn.Linear, nn.Conv1d))]
    try:
        with torch.no_grad():
            actions = deployed_action(policy, obs, action_clip)
    finally:
        for hook in hooks:
            hook.remove()
    return actions, scale


def activation_scale(policy: nn.Module, obs: torch.Tensor,
                     action_clip: ActionClip = float('inf')) -> torch.Tensor:
    """[B] ``max(1, largest |value| into or out of a Linear or Conv1d layer)`` while computing
    the deployed action of each row of ``obs`` [B, obs_dim]: the size of the float32 rounding
    error two correct implementations may differ by."""
    return _deployed_action_and_scale(policy, obs, action_clip)[1]


def parity_errors(policy: nn.Module, model: str | Path | bytes, num_samples: int = 1000,
                  seed: int = 0, action_clip: ActionClip = float('inf')
                  ) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime vs :func:`deployed_action` on random observations: per sample the largest
    abs difference over actions [num_samples] and its :func:`activation_scale` [num_samples]."""
    source = model if isinstance(model, bytes) else str(model)
    session = ort.InferenceSession(source, session_options(),
                                   providers=['CPUExecutionProvider'])
    obs_dim = session.get_inputs()[0].shape[1]
    obs = random_observations(obs_dim, num_samples, seed)
    onnx_actions = session.run([OUTPUT_NAME], {INPUT_NAME: obs})[0]
    torch_actions, scale = _deployed_action_and_scale(policy, torch.from_numpy(obs),
                                                      action_clip)
    diff = np.abs(onnx_actions - torch_actions.numpy()).max(axis=1).astype(np.float64)
    return diff, scale.numpy()


def verify_onnx(policy: nn.Module, model: str | Path | bytes, num_samples: int = 1000,
                seed: int = 0, action_clip: ActionClip = float('inf')) -> float:
    """Max abs difference between onnxruntime and :func:`deployed_action` on random obs."""
    return float(parity_errors(policy, model, num_samples, seed, action_clip)[0].max())


def export_onnx(policy: ActorCritic, spec: RobotSpec | GymTaskSpec, path: str | Path, *,
                opset: int = 17, extra_metadata: dict[str, Any] | None = None,
                action_clip: ActionClip | None = None, obs_history: int = 1) -> Path:
    """Write ``policy``'s deterministic action as ONNX to ``path`` (atomically); returns it.

    Input ``obs`` [batch, obs_history * obs_dim] (the last ``obs_history`` observations, oldest
    first: ``env.policy_history``), output ``actions`` [batch, A] clipped to ``action_clip``:
    a float (+-clip, the robot env's ``clip_actions`` during training) or (low [A], high [A]);
    by default ``EnvConfig().clip_actions`` for a robot and the action space's bounds for a
    Gymnasium task. Normaliser inside the graph; the spec (robot or Gymnasium task) and
    ``action_clip`` in the metadata. Raises ValueError for a policy that cannot be deployed and
    :class:`ExportError` when onnxruntime and torch disagree on some random observation by
    ``PARITY_TOLERANCE`` x its activation scale or more (1e-5 for a network whose values stay
    within +-1; 1e-3 where they reach 100).
    """
    if opset < MIN_OPSET:
        raise ValueError(f'opset {opset} is too old; use {MIN_OPSET} or newer')
    obs_history = check_history(obs_history, 'obs_history (env.policy_history)')
    if obs_history > 1 and spec.to_metadata().get('kind'):
        raise ValueError(f'obs_history = {obs_history}: a Gymnasium task student reads its '
                         'observation only; use obs_history 1')
    _check_exportable(policy, spec, obs_history)
    frame_dim, action_dim, _ = _sizes(spec)
    if action_clip is None:
        action_clip = getattr(spec, 'action_bounds', DEFAULT_ACTION_CLIP)
    action_clip = _checked_clip(action_clip, action_dim)
    model = onnx.load_from_string(_graph_bytes(policy, frame_dim * obs_history, opset,
                                               action_clip))
    _name_output_dims(model, action_dim)
    model.producer_name = 'claw_rl_ros'
    model.doc_string = f'{spec.name} student policy: actions = actor(normalise(obs))'
    props = _metadata(spec, extra_metadata, action_clip, obs_history)
    _set_metadata(model, props)
    onnx.checker.check_model(model)
    diff, scale = parity_errors(policy, model.SerializeToString(), action_clip=action_clip)
    # The worst sample relative to its own activation scale (NaN fails too).
    scaled = diff / scale
    worst = int(np.argmax(np.where(np.isnan(scaled), np.inf, scaled)))
    if not np.all(scaled < PARITY_TOLERANCE):
        raise ExportError(f'onnxruntime and torch disagree by {diff[worst]:.3g} at activation '
                          f'scale {scale[worst]:.3g} ({scaled[worst]:.3g} per unit, tolerance '
                          f'{PARITY_TOLERANCE:g}); the model was not written')
    _set_metadata(model, {'parity_max_abs_diff': json.dumps(float(diff.max())),
                          'parity_max_scaled_diff': json.dumps(float(scaled.max()))})
    path = Path(path)
    atomic_write_bytes(path, model.SerializeToString())
    return path


def export_checkpoint(checkpoint_path: str | Path, out_path: str | Path) -> Path:
    """Export a training checkpoint's student for the robot, or the Gymnasium env
    (``gym_env``), named in its config."""
    policy, cfg, payload = load_policy(checkpoint_path)
    extra = {'checkpoint': Path(checkpoint_path).name, 'iteration': payload.get('iteration'),
             'total_steps': payload.get('total_steps'), 'algorithm': cfg.algorithm}
    if cfg.gym_env:
        return export_onnx(policy, gym_task_spec(cfg.gym_env), out_path, extra_metadata=extra)
    robot = load_robot(cfg.env.robot, overlay=cfg.env.robot_overlay)
    trained = payload.get('robot')
    problems = robot.mismatches(trained) if trained else []
    if problems:
        raise ConfigError(str(checkpoint_path), 'robot', f'robot {cfg.env.robot!r} changed '
                          'since this checkpoint was trained: ' + '; '.join(problems))
    # The ground it learnt on, for the policy card (env.terrain; enabled false: the plane).
    extra['terrain'] = to_dict(cfg.env.terrain)
    return export_onnx(policy, robot, out_path, extra_metadata=extra,
                       action_clip=cfg.env.clip_actions, obs_history=cfg.env.policy_history)
