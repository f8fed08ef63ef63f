"""SAC's networks: a tanh-squashed Gaussian actor and an ensemble of Q critics.

:class:`SACPolicy` is the student (and teacher) that :class:`~.sac.SAC` trains and export
runs; :class:`EnsembleQ` holds the twin critics as one stacked module. The squashed log-prob
helpers are shared with the batched actor, which samples the same distribution.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn
import torch.nn.functional as F

from .networks import (
    ACTIVATIONS, EmpiricalNormalization, gaussian_log_prob, LOG_SQRT_2PI, mlp, mlp_forward,
    select_obs)
from .registry import Obs

# Bounds of the actor's log std (CleanRL's SAC: squashed into [-5, 2] with a tanh).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
LOG_2 = math.log(2.0)


def log1m_tanh_sq(u: torch.Tensor) -> torch.Tensor:
    """``log(1 - tanh(u)^2)`` elementwise, stable for large ``|u|``."""
    # 1 - tanh(u)^2 = 4 / (e^u + e^-u)^2  =>  log = 2 (log 2 - u - softplus(-2 u))
    return 2.0 * (LOG_2 - u - F.softplus(-2.0 * u))


def squashed_log_prob(u: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Log-density [B] of ``a = tanh(u)``, ``u ~ N(mean, std)`` [B, A], in the [-1, 1] box."""
    # Change of variables: log p(a) = log N(u) - sum log |da/du| = log N(u) - sum log(1 - a^2)
    return gaussian_log_prob(u, mean, std) - log1m_tanh_sq(u).sum(-1)


def squashed_log_prob_from_noise(noise: torch.Tensor, log_std: torch.Tensor,
                                 u: torch.Tensor) -> torch.Tensor:
    """:func:`squashed_log_prob` [B] for ``u = mean + exp(log_std) * noise`` (all [B, A]).

    Same value and gradients in exact arithmetic, fewer ops: ``(u - mean) / std`` is ``noise``.
    """
    # log N(u; mean, std) = -noise^2 / 2 - log std - log sqrt(2 pi); minus log(1 - tanh(u)^2)
    return (-0.5 * noise.square() - log_std - LOG_SQRT_2PI - log1m_tanh_sq(u)).sum(-1)


class EnsembleQ(nn.Module):
    """``num_q`` Q networks as one module: ``(obs [B, critic_dim], action [B, A]) -> [num_q, B]``.

    Member ``i`` is the MLP ``[critic_dim + A] -> hidden -> 1`` that :func:`~.networks.mlp`
    builds; layer ``l`` of all members is one stacked weight ``weights[l]`` [num_q, in, out]
    (slice ``i`` is member ``i``'s ``nn.Linear`` weight, transposed, so neither the matmul
    nor its weight gradient needs a layout copy) and bias ``biases[l]`` [num_q, out], applied
    with one batched matmul: the twin critics cost one op per layer forward and backward.
    Members are initialised exactly as separate MLPs (same random stream).
    """

    def __init__(self, critic_dim: int, num_actions: int, hidden: list[int], activation: str,
                 num_q: int = 2):
        super().__init__()
        members = [[m for m in mlp(critic_dim + num_actions, hidden, 1, activation)
                    if isinstance(m, nn.Linear)] for _ in range(num_q)]
        layers = list(zip(*members))
        self.weights = nn.ParameterList(torch.stack([m.weight.detach().t() for m in layer])
                                        for layer in layers)
        self.biases = nn.ParameterList(torch.stack([m.bias.detach() for m in layer])
                                       for layer in layers)
        # In place where the activation allows it: no fresh [num_q, B, hidden] buffer per layer
        # (the matmul before it does not need its output for its gradient).
        act = ACTIVATIONS[activation]
        self.activation = act(inplace=True) if 'inplace' in inspect.signature(act).parameters \
            else act()
        self.num_q = num_q

    def forward(self, x: torch.Tensor, a: torch.Tensor, detach_weights: bool = False,
                hidden_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Q values [num_q, B] (float32); with ``detach_weights`` gradients reach only ``x``
        and ``a``; ``hidden_dtype`` (e.g. bfloat16) for every layer's matmul but the last, as
        in :func:`~.networks.mlp_forward`."""
        h = torch.cat([x, a], dim=-1).expand(self.num_q, -1, -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if detach_weights:
                w, b = w.detach(), b.detach()
            if hidden_dtype is not None:
                # Hidden layers in hidden_dtype, the output layer in float32.
                dtype = hidden_dtype if i < last else torch.float32
                h, w, b = h.to(dtype), w.to(dtype), b.to(dtype)
            # Per member: h [B, in] @ w [in, out] + b [out]
            h = torch.baddbmm(b.unsqueeze(1), h, w)
            if i < last:
                h = self.activation(h)
        return h.squeeze(-1)


class SACPolicy(nn.Module):
    """Squashed Gaussian actor ``a = bias + scale * tanh(u)``, ``u ~ N(mu(obs), sigma(obs))``,
    and twin Q critics (one :class:`EnsembleQ`) on the noise-free groups; normalisers as in
    ActorCritic.

    Shapes: actor obs [B, actor_dim] -> (mean, std) [B, A] of ``u``; the critics take the
    squashed action ``tanh(u)`` [B, A] in [-1, 1] (scale-free, as stable-baselines3 does).
    """

    # Statistics are merged once per rollout after the update (``Algorithm.learn``).
    normalize_every_step = False

    def __init__(self, actor_dim: int, critic_dim: int, num_actions: int, *,
                 actor_hidden_dims: list[int], critic_hidden_dims: list[int],
                 activation: str = 'relu', normalize_obs: bool = True,
                 actor_obs_groups: list[str] | None = None,
                 critic_obs_groups: list[str] | None = None,
                 action_low: torch.Tensor | float = -1.0, action_high: torch.Tensor | float = 1.0):
        super().__init__()
        self.actor_obs_groups = list(actor_obs_groups or ['policy'])
        self.critic_obs_groups = list(critic_obs_groups or ['policy_noise_free', 'privileged'])
        self.actor = mlp(actor_dim, actor_hidden_dims, 2 * num_actions, activation)
        self.critic = EnsembleQ(critic_dim, num_actions, critic_hidden_dims, activation)
        self.actor_normalizer = EmpiricalNormalization(actor_dim) if normalize_obs \
            else nn.Identity()
        self.critic_normalizer = EmpiricalNormalization(critic_dim) if normalize_obs \
            else nn.Identity()
        low = torch.as_tensor(action_low, dtype=torch.float32).expand(num_actions)
        high = torch.as_tensor(action_high, dtype=torch.float32).expand(num_actions)
        self.register_buffer('action_scale', (high - low) / 2.0)
        self.register_buffer('action_bias', (high + low) / 2.0)

    def action_mean_log_std(self, obs: Obs, hidden_dtype: torch.dtype | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-tanh Gaussian parameters: mean [B, A] and log std [B, A] (float32; the hidden
        layers' matmuls in ``hidden_dtype``, see :func:`~.networks.mlp_forward`)."""
        x = self.actor_normalizer(select_obs(obs, self.actor_obs_groups))
        mean, log_std = mlp_forward(self.actor, x, hidden_dtype).chunk(2, dim=-1)
        # Squash the raw log std into [LOG_STD_MIN, LOG_STD_MAX] smoothly (CleanRL).
        return mean, LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1.0)

    def action_mean_std(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-tanh Gaussian parameters: mean [B, A], std [B, A] (what distillation compares)."""
        mean, log_std = self.action_mean_log_std(obs)
        return mean, log_std.exp()

    def sample(self, obs: Obs, generator: torch.Generator | None = None,
               hidden_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised squashed action ``tanh(u)`` [B, A] in [-1, 1] and its log-prob [B]."""
        mean, log_std = self.action_mean_log_std(obs, hidden_dtype)
        noise = torch.randn(mean.shape, generator=generator)
        u = mean + log_std.exp() * noise
        return torch.tanh(u), squashed_log_prob_from_noise(noise, log_std, u)

    def to_env(self, squashed: torch.Tensor) -> torch.Tensor:
        """[-1, 1] actions [B, A] -> the env's action range."""
        return self.action_bias + self.action_scale * squashed

    def act_inference(self, obs: Obs) -> torch.Tensor:
        """Deterministic action ``bias + scale * tanh(mean)`` [B, A]: what deployment runs."""
        return self.to_env(torch.tanh(self.action_mean_std(obs)[0]))

    def critic_input(self, obs: Obs) -> torch.Tensor:
        return self.critic_normalizer(select_obs(obs, self.critic_obs_groups))

    def update_normalization(self, obs: Obs) -> None:
        if isinstance(self.actor_normalizer, EmpiricalNormalization):
            self.actor_normalizer.update(select_obs(obs, self.actor_obs_groups))
            self.critic_normalizer.update(select_obs(obs, self.critic_obs_groups))
