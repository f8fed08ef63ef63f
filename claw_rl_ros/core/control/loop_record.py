"""The policy node's side of the control-loop actor: stochastic actions and per-step records.

In training mode the policy node samples ``a ~ N(mu, sigma)`` around the exported student's
mean (``sigma``: the model's ``action_std`` metadata, as the batched actors sample) and, for
every RL tick, publishes a :class:`PolicyRecord` of what the rollout chunk needs from its side.
The record travels as a ``std_msgs/Float64MultiArray`` whose ``layout.dim`` labels the fields
(label = field name, size = its length, stride = size), in the order of :func:`record_layout`:

============== ====== ===========================================================
label          size   content
============== ====== ===========================================================
stamp          1      stamp [s] of the joint state the policy acted on
policy_version 1      the trainer's version of the acting model (metadata)
model_sha      1      first 12 hex digits of the model's sha256, as an integer
gait_phase     1      the policy's gait clock in [0, 1) when it observed
log_prob       1      log N(action; mu, sigma), summed over the actions
obs            D      the policy observation it acted on
action         A      the sampled action (unclipped, as the batched actor records it)
mu             A      the model's mean action
sigma          A      the behaviour std
last_action    A      the previous action as the observation saw it (clipped)
target         J      the joint command it published (``joints`` order)
============== ====== ===========================================================

float64 carries every integer above exactly (a 12-digit hex sha is 48 bits). No ROS imports.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
import json
import math
from typing import Any, Sequence

import numpy as np

SHA_CHARS = 12
LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass
class PolicyRecord:
    """One RL tick of the policy node in training mode; arrays are float64 (module table)."""

    stamp: float
    policy_version: int
    model_sha: str
    gait_phase: float
    log_prob: float
    obs: np.ndarray
    action: np.ndarray
    mu: np.ndarray
    sigma: np.ndarray
    last_action: np.ndarray
    target: np.ndarray


SCALARS = ('stamp', 'policy_version', 'model_sha', 'gait_phase', 'log_prob')


def record_layout(obs_dim: int, num_actions: int) -> list[tuple[str, int]]:
    """[(label, size), ...] of a record's fields, in message order."""
    sizes = {'obs': obs_dim, 'target': num_actions}
    return [(f.name, sizes.get(f.name, 1 if f.name in SCALARS else num_actions))
            for f in fields(PolicyRecord)]


def pack_record(record: PolicyRecord) -> tuple[list[tuple[str, int]], np.ndarray]:
    """(layout, [sum of sizes] float64 data) of a record."""
    layout = record_layout(len(record.obs), len(record.action))
    values = []
    for name, size in layout:
        value = getattr(record, name)
        if name == 'model_sha':
            value = int(value, 16)
        value = np.asarray(value, dtype=np.float64).reshape(-1)
        if value.size != size:
            raise ValueError(f'record field {name} has {value.size} values, expected {size}')
        values.append(value)
    return layout, np.concatenate(values)


def unpack_record(layout: Sequence[tuple[str, int]], data: Any, obs_dim: int,
                  num_actions: int) -> PolicyRecord:
    """The record in ``data`` (float64 array-like); ValueError naming the field that does not
    fit this robot's layout (labels and sizes must be exactly :func:`record_layout`)."""
    expected = record_layout(obs_dim, num_actions)
    if list(layout) != expected:
        raise ValueError(f'record layout {list(layout)} is not {expected}: policy node and '
                         'sim node must run the same robot and release')
    values = np.asarray(data, dtype=np.float64)
    total = sum(size for _, size in expected)
    if values.shape != (total,):
        raise ValueError(f'record data has {values.size} values, its layout {total}')
    if not np.isfinite(values).all():
        raise ValueError('record data holds NaN or inf')
    out, pos = {}, 0
    for name, size in expected:
        out[name] = values[pos:pos + size]
        pos += size
    scalars = {name: float(out.pop(name)[0]) for name in SCALARS}
    scalars['policy_version'] = int(scalars['policy_version'])
    scalars['model_sha'] = f'{int(scalars["model_sha"]):0{SHA_CHARS}x}'
    return PolicyRecord(**scalars, **out)


# A SAC student's exploration: bias + scale * tanh(mean + std * eps) (see sac_chunk_learner).
BEHAVIOUR_KIND = 'squashed_gaussian'


def behaviour_metadata(metadata: dict[str, str], num_actions: int,
                       sha256: str) -> tuple[np.ndarray, int]:
    """([A] action std, policy version) from an exported model's metadata; ValueError when
    it is not a trainer's export (actors and training mode need both)."""
    missing = [k for k in ('action_std', 'policy_version') if k not in metadata]
    if missing:
        raise ValueError(f'model {sha256[:SHA_CHARS]} has no {", ".join(missing)} metadata: '
                         'actors need a model exported by the trainer')
    std = np.asarray(json.loads(metadata['action_std']), dtype=np.float64)
    if std.shape != (num_actions,) or not bool((std > 0).all()):
        raise ValueError(f'action_std metadata {std.tolist()} must be {num_actions} positive '
                         'values')
    return std, int(json.loads(metadata['policy_version']))


def behaviour_squash(metadata: dict[str, str], num_actions: int
                     ) -> tuple[np.ndarray, np.ndarray] | None:
    """(low [A], high [A]) of a squashed-Gaussian behaviour (a SAC student's export), or None
    for a Gaussian one; ValueError for metadata that is neither."""
    if 'behaviour' not in metadata:
        return None
    spec = json.loads(metadata['behaviour'])
    low = np.asarray(spec.get('low', []), np.float32)
    high = np.asarray(spec.get('high', []), np.float32)
    if spec.get('kind') != BEHAVIOUR_KIND or low.shape != (num_actions,) or \
            high.shape != (num_actions,) or not bool((low < high).all()):
        raise ValueError(f'behaviour metadata {spec} must be kind {BEHAVIOUR_KIND!r} with '
                         f'{num_actions} low < high bounds')
    return low, high


class GaussianSampler:
    """Samples around an exported model's mean with its ``action_std``; tags its records.

    The maths of :func:`~..learning.networks.sample_gaussian` in numpy: the policy node runs
    without torch (test_deploy_imports.py).

    ``policy`` is a validated :class:`~claw_rl_ros.core.export.onnx_policy.OnnxPolicy`; ValueError
    (from :func:`behaviour_metadata`) if it lacks the trainer's metadata.
    """

    def __init__(self, policy: Any, rng: np.random.Generator):
        self.sigma, self.policy_version = behaviour_metadata(policy.metadata,
                                                             policy.num_actions, policy.sha256)
        if behaviour_squash(policy.metadata, policy.num_actions) is not None:
            raise ValueError(f'model {policy.sha256[:SHA_CHARS]} is a SAC student (squashed '
                             'Gaussian behaviour): the control-loop actor samples PPO\'s '
                             'Gaussian only; let batched actors (actor_node) collect for SAC')
        self.model_sha = policy.sha256[:SHA_CHARS]
        self.rng = rng

    def sample(self, mu: np.ndarray) -> tuple[np.ndarray, float]:
        """(action [A], log-density) of one draw a ~ N(mu, sigma) around [A] mean ``mu``."""
        mu = np.asarray(mu, dtype=np.float64)
        action = mu + self.sigma * self.rng.standard_normal(mu.shape)
        return action, gaussian_log_prob(action, mu, self.sigma)

    def record(self, stamp: float, gait_phase: float, log_prob: float, obs: np.ndarray,
               action: np.ndarray, mu: np.ndarray, last_action: np.ndarray,
               target: np.ndarray) -> PolicyRecord:
        """The tick's record (copies of every array)."""
        return PolicyRecord(stamp=float(stamp), policy_version=self.policy_version,
                            model_sha=self.model_sha, gait_phase=float(gait_phase),
                            log_prob=float(log_prob), obs=_vector(obs), action=_vector(action),
                            mu=_vector(mu), sigma=_vector(self.sigma),
                            last_action=_vector(last_action), target=_vector(target))


def _vector(values: Any) -> np.ndarray:
    """A float64 [n] copy."""
    return np.array(values, dtype=np.float64).reshape(-1)


def gaussian_log_prob(action: np.ndarray, mu: np.ndarray, sigma: np.ndarray) -> float:
    """Diagonal-Gaussian log-density summed over [A] actions (networks.gaussian_log_prob)."""
    # log N(a; mu, s) = -(a - mu)^2 / (2 s^2) - log s - log sqrt(2 pi)
    return float(np.sum(-np.square(action - mu) / (2.0 * np.square(sigma)) - np.log(sigma)
                        - LOG_SQRT_2PI))
