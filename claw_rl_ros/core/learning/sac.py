"""Soft actor-critic with an optional online-distillation term (the PPO algorithm interface).

``act`` -> ``process_env_step`` (per control step, into a :class:`ReplayBuffer`),
``compute_returns`` (nothing to do: targets are formed per sampled batch), ``update`` (gradient
steps on uniformly sampled batches; returns a dict of floats). Twin Q critics with Polyak-averaged
targets, a tanh-squashed Gaussian actor and an automatically tuned entropy temperature
(Haarnoja et al. 2018; the loss forms of stable-baselines3). Distillation adds
``alpha * KL(teacher || student)`` on the pre-tanh Gaussians to the actor loss, through the same
:func:`~.opd.combined_loss` and :class:`~.registry.PolicyRegistry` as PPO.

Actor lag: SAC is off-policy; its losses never use the behaviour policy's log-probabilities, so
any recent actor version may produce the transitions (local worlds, remote actors publishing
version-tagged chunks). Lag only makes the replay data older, as the replay buffer does anyway;
no importance correction is applied and the only bound on lag is the buffer's horizon
(``buffer_size``). With ``n_step > 1`` the n-step return is, as in Rainbow / D4PG, uncorrected
for the behaviour policy, so keep n small when actors lag much.
"""

from __future__ import annotations

import copy
import inspect
import math
from typing import Any
import warnings

import torch
from torch import nn
import torch.nn.functional as F

from .algorithm import Algorithm
from .networks import (
    ACTIVATIONS, EmpiricalNormalization, gaussian_log_prob, LOG_SQRT_2PI, mlp, mlp_forward,
    select_obs)
from .opd import combined_loss, compute_distillation_loss
from .registry import Obs
from .replay import ReplayBuffer
from .train_config import DistillationConfig, SACConfig

# Bounds of the actor's log std (CleanRL's SAC: squashed into [-5, 2] with a tanh).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
LOG_2 = math.log(2.0)
# What update() reports, in the order of _update_batch's loss vector.
LOSS_KEYS = ('critic_loss', 'actor_loss', 'ent_coef_loss', 'entropy', 'q_mean',
             'distillation_loss')


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


def native_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (oneDNN sees AVX512-BF16 or AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def matmul_dtype(name: str) -> torch.dtype | None:
    """``sac.matmul_dtype`` -> the hidden layers' dtype (None: float32 as stored); ``auto`` is
    bfloat16 where the CPU computes it natively (AVX512-BF16 / AMX), else float32 (as PyTorch
    picks TF32 for float32 matmuls on GPUs that have it)."""
    native = native_bfloat16()
    if name == 'float32' or (name == 'auto' and not native):
        return None
    # bfloat16 without native CPU support is emulated: slower, not wrong.
    if not native:
        warnings.warn('sac.matmul_dtype: bfloat16 has no native support on this CPU (no '
                      'AVX512-BF16 / AMX): the gradient steps get slower, not faster; set '
                      'sac.matmul_dtype: float32', stacklevel=2)
    return torch.bfloat16


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * source, every parameter in one foreach call."""
    # lerp: target + tau (source - target) = (1 - tau) target + tau source
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


@torch.no_grad()
def fused_adam_step(optimizer: torch.optim.Adam) -> None:
    """``optimizer.step()`` then ``zero_grad()`` for a ``fused=True`` Adam, minus the Python
    bookkeeping of ``Optimizer.step`` (~0.3 ms per call here, as long as the kernel itself).

    The same kernel on the optimiser's own state (bit-identical results, state_dict unchanged);
    the first step (state not yet created) and unsupported options go through ``step()``.
    """
    state = optimizer.state
    for group in optimizer.param_groups:
        params = [p for p in group['params'] if p.grad is not None]
        if group['amsgrad'] or group['maximize'] or group.get('decoupled_weight_decay') or any(
                p not in state for p in params):
            optimizer.step()
            optimizer.zero_grad()
            return
    for group in optimizer.param_groups:
        params = [p for p in group['params'] if p.grad is not None]
        if not params:
            continue
        states = [state[p] for p in params]
        steps = [s['step'] for s in states]
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group['betas']
        torch._fused_adam_(params, [p.grad for p in params], [s['exp_avg'] for s in states],
                           [s['exp_avg_sq'] for s in states], [], steps, amsgrad=False,
                           lr=group['lr'], beta1=beta1, beta2=beta2,
                           weight_decay=group['weight_decay'], eps=group['eps'],
                           maximize=False, grad_scale=None, found_inf=None)
        for p in params:
            p.grad = None


class EnsembleQ(nn.Module):
    """``num_q`` Q networks as one module: ``(obs [B, critic_dim], action [B, A]) -> [num_q, B]``.

    Member ``i`` is the MLP ``[critic_dim + A] -> hidden -> 1`` that :func:`~.networks.mlp`
    builds; layer ``l`` of all members is one stacked weight ``weights[l]`` [num_q, in, out]
    (slice ``i`` is member ``i``'s ``nn.Linear`` weight, transposed, so neither the matmul
    nor its weight gradient needs a layout copy) and bias ``biases[l]`` [num_q, out], applied
    with one batched matmul: the twin critics cost one op per layer forward and backward.
    Members are initialised exactly as separate MLPs (same random stream), and state dicts of
    the former two-MLP layout (``q1.0.weight`` ...) load into it.
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
        self._register_load_state_dict_pre_hook(self._stack_separate_mlps)

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

    def _stack_separate_mlps(self, state: dict[str, Any], prefix: str, *_: Any) -> None:
        """Turn the former layout's ``q1.0.weight``, ``q2.0.weight`` ... into stacked entries."""
        members = [f'{prefix}q{i + 1}.' for i in range(self.num_q)]
        if f'{members[0]}0.weight' not in state:
            return
        for layer in range(len(self.weights)):
            # nn.Sequential numbers Linear, activation, Linear, ...: layer l is entry 2 l.
            state[f'{prefix}weights.{layer}'] = torch.stack(
                [state.pop(f'{m}{2 * layer}.weight').t() for m in members])
            state[f'{prefix}biases.{layer}'] = torch.stack(
                [state.pop(f'{m}{2 * layer}.bias') for m in members])


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


class SAC(Algorithm):
    """SAC on a :class:`SACPolicy` student, plus alpha * KL(teacher || student) on the actor."""

    def __init__(self, policy: SACPolicy, cfg: SACConfig, distill: DistillationConfig,
                 teacher: nn.Module | None = None, generator: torch.Generator | None = None):
        self.policy = policy
        self.cfg = cfg
        self.distill = distill
        self.generator = generator
        self.target_critic = copy.deepcopy(policy.critic).requires_grad_(False)
        # Fused Adam: on CPU ~4-7x faster than the single-tensor / foreach paths for these sizes.
        self.critic_optimizer = torch.optim.Adam(policy.critic.parameters(), lr=cfg.critic_lr,
                                                 fused=True)
        num_actions = policy.action_scale.shape[0]
        # Automatic temperature: minimise -log_ent_coef * (log pi + target entropy).
        self.target_entropy = -float(num_actions) if cfg.target_entropy is None \
            else cfg.target_entropy
        self.log_ent_coef = torch.tensor(math.log(cfg.init_ent_coef), requires_grad=True)
        # Hidden-layer matmuls of the gradient steps (acting and export stay float32).
        self.matmul_dtype = matmul_dtype(cfg.matmul_dtype)
        # The actor and the temperature share one Adam (a parameter group each, own lr): each
        # loss sees the other's parameters detached, so one backward and one step serve both.
        groups = [{'params': list(policy.actor.parameters()), 'lr': cfg.actor_lr}]
        if cfg.auto_ent_coef:
            groups.append({'params': [self.log_ent_coef], 'lr': cfg.ent_coef_lr})
        self.actor_optimizer = torch.optim.Adam(groups, fused=True)
        self.init_registry(policy, teacher, distill.teacher_mode)
        self.storage: ReplayBuffer | None = None
        self.num_steps = 1
        self.num_transitions = 0
        self.num_updates = 0
        self._owed_updates = 0.0
        self._pending: dict[str, Any] = {}

    @property
    def ent_coef(self) -> float:
        return float(self.log_ent_coef.detach().exp())

    def init_storage(self, num_steps: int, num_envs: int, obs_dims: dict[str, int],
                     num_actions: int) -> None:
        """Replay of ``buffer_size`` transitions: ``buffer_size // num_envs`` rows of N worlds."""
        self.num_steps = num_steps
        self.storage = ReplayBuffer(max(1, self.cfg.buffer_size // num_envs), num_envs, obs_dims,
                                    num_actions, self.cfg.n_step, self.cfg.gamma)

    @torch.inference_mode()
    def act(self, obs: Obs) -> torch.Tensor:
        """Env actions [N, A]: uniform over the range until learning_starts, then the policy."""
        n = next(iter(obs.values())).shape[0]
        num_actions = self.policy.action_scale.shape[0]
        if self.num_transitions < self.cfg.learning_starts:
            squashed = torch.rand((n, num_actions), generator=self.generator) * 2.0 - 1.0
        else:
            squashed, _ = self.policy.sample(obs, self.generator)
        self._pending = {'obs': obs, 'actions': squashed}
        return self.policy.to_env(squashed)

    @torch.no_grad()
    def process_env_step(self, rewards: torch.Tensor, dones: torch.Tensor,
                         time_outs: torch.Tensor, final_obs: Obs | None,
                         next_obs: Obs | None = None) -> None:
        """Store the transition; only true terminations stop the bootstrap (time-outs do not)."""
        if next_obs is None:
            raise ValueError('SAC needs next_obs in process_env_step (the observation after '
                             'the step)')
        if final_obs is not None:
            # Worlds that ended bootstrap from the state they ended in, not the reset state.
            ended = dones > 0
            next_obs = {k: torch.where(ended[:, None], final_obs[k], v)
                        for k, v in next_obs.items()}
        terminated = dones * (1.0 - time_outs)
        self.storage.add(self._pending['obs'], self._pending['actions'], rewards, terminated,
                         dones, next_obs)
        self._stored(rewards.shape[0])

    def extend_replay(self, obs: Obs, actions: torch.Tensor, rewards: torch.Tensor,
                      terminated: torch.Tensor, dones: torch.Tensor, next_obs: Obs) -> None:
        """Store a block of collected transitions (``[K, N, ...]``, squashed actions), as K
        calls of :meth:`process_env_step` would; they are this iteration's (the normaliser's
        and the KL metric's rows)."""
        self.storage.extend(obs, actions, rewards, terminated, dones, next_obs)
        self.num_steps = actions.shape[0]
        self._stored(actions.shape[0] * actions.shape[1])

    def _stored(self, count: int) -> None:
        """``count`` new transitions: counted, and ``utd_ratio`` gradient steps owed each."""
        self.num_transitions += count
        self._owed_updates += self.cfg.utd_ratio * count

    def compute_returns(self, last_obs: Obs) -> None:
        """Nothing to do: SAC forms its (n-step) targets per sampled batch in :meth:`update`."""

    def rollout_obs(self, max_samples: int = 4096) -> Obs:
        """Observations [B, dim] of the latest iteration's steps (normaliser and KL metric)."""
        return self.storage.recent_obs(self.num_steps, max_samples)

    def update(self, alpha: float = 0.0) -> dict[str, float]:
        """``utd_ratio`` gradient steps per new transition (once learning_starts is reached)."""
        # Also after a resume without the replay buffer: updates wait until it holds
        # learning_starts transitions again (the policy, not random actions, fills it).
        refilled = len(self.storage) >= min(self.cfg.learning_starts,
                                            self.storage.capacity * self.storage.num_envs)
        if self.num_transitions < self.cfg.learning_starts or not refilled:
            self._owed_updates = 0.0
            return {**{k: float('nan') for k in LOSS_KEYS}, 'ent_coef': self.ent_coef,
                    'alpha': alpha, 'updates': 0.0}
        count = int(self._owed_updates)
        self._owed_updates -= count
        # Losses stay tensors until the end: no host conversion per gradient step.
        sums = torch.zeros(len(LOSS_KEYS))
        for _ in range(count):
            sums += self._update_batch(alpha)
        out = dict(zip(LOSS_KEYS, (sums / max(count, 1)).tolist()))
        out.update(ent_coef=self.ent_coef, alpha=alpha, updates=float(count))
        return out

    def _update_batch(self, alpha: float) -> torch.Tensor:
        """One gradient step of the critics, then the actor and temperature on one batch;
        the detached losses [len(LOSS_KEYS)] in ``LOSS_KEYS`` order."""
        cfg, policy = self.cfg, self.policy
        b = self.storage.sample(cfg.batch_size, self.generator)
        ent_coef = self.log_ent_coef.detach().exp()
        critic_obs = policy.critic_input(b.obs)
        # Soft target: y = R + gamma^k (1 - done) (min_i Q'_i(s', a') - ent_coef log pi(a'|s')).
        with torch.no_grad():
            next_a, next_logp = policy.sample(b.next_obs, self.generator, self.matmul_dtype)
            next_q = self.target_critic(policy.critic_input(b.next_obs), next_a,
                                        hidden_dtype=self.matmul_dtype).amin(0)
            y = b.rewards + b.discounts * (1.0 - b.terminated) * (next_q - ent_coef * next_logp)
        # Mean over both members and the batch = 0.5 (mse(Q1, y) + mse(Q2, y)).
        q = policy.critic(critic_obs, b.actions, hidden_dtype=self.matmul_dtype)
        critic_loss = F.mse_loss(q, y.expand_as(q))
        critic_loss.backward()
        self._clip(policy.critic)
        fused_adam_step(self.critic_optimizer)
        # Actor: minimise ent_coef log pi(a|s) - min_i Q_i(s, a), a reparameterised, + alpha KL;
        # the (updated) critics pass gradients to the action only, not to their weights.
        a, logp = policy.sample(b.obs, self.generator, self.matmul_dtype)
        q_pi = policy.critic(critic_obs, a, detach_weights=True,
                             hidden_dtype=self.matmul_dtype).amin(0)
        actor_loss = (ent_coef * logp - q_pi).mean()
        distillation = compute_distillation_loss(self.registry, b.obs) \
            if alpha > 0.0 and 'teacher' in self.registry else None
        loss = combined_loss(actor_loss, distillation, alpha)
        # Temperature: grows while the entropy -log pi is below the target, shrinks above it.
        ent_loss = -(self.log_ent_coef * (logp.detach() + self.target_entropy)).mean()
        (loss + ent_loss if cfg.auto_ent_coef else loss).backward()
        self._clip(policy.actor)
        fused_adam_step(self.actor_optimizer)
        self.num_updates += 1
        if self.num_updates % cfg.target_update_interval == 0:
            polyak_update(self.target_critic, policy.critic, cfg.tau)
        zero = actor_loss.new_zeros(())
        return torch.stack([critic_loss, actor_loss, ent_loss, -logp.mean(), q[0].mean(),
                            zero if distillation is None else distillation]).detach()

    def _clip(self, module: nn.Module) -> None:
        if self.cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(module.parameters(), self.cfg.max_grad_norm)

    def state_dict(self) -> dict[str, Any]:
        """Optimisers, temperature, target critics, counters and (optionally) the replay."""
        return {'actor_optimizer': self.actor_optimizer.state_dict(),
                'critic_optimizer': self.critic_optimizer.state_dict(),
                'log_ent_coef': self.log_ent_coef.detach().clone(),
                'target_critic': self.target_critic.state_dict(),
                'counters': [self.num_transitions, self.num_updates, self._owed_updates],
                'replay': self.storage.state_dict() if self.cfg.checkpoint_replay else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (or the former layout: separate Q networks and a
        temperature optimiser of its own, converted on the way in)."""
        if 'ent_optimizer' in state:
            state = self._from_separate_layout(state)
        self.actor_optimizer.load_state_dict(state['actor_optimizer'])
        self.critic_optimizer.load_state_dict(state['critic_optimizer'])
        with torch.no_grad():
            self.log_ent_coef.copy_(state['log_ent_coef'])
        self.target_critic.load_state_dict(state['target_critic'])
        self.num_transitions, self.num_updates, self._owed_updates = state['counters']
        if state['replay'] is not None:
            self.storage.load_state_dict(state['replay'])

    def _from_separate_layout(self, state: dict[str, Any]) -> dict[str, Any]:
        """Optimiser states of the former layout in this one's parameter order.

        Critic: parameter ``m * 2 L + 2 l + k`` (member m, layer l of L, k 0 weight / 1 bias)
        becomes slice m of stacked parameter ``k L + l`` (weights transposed). Actor: the
        temperature's own Adam becomes the second parameter group of the actor's.
        """
        critic = state['critic_optimizer']
        num_layers = len(self.policy.critic.weights)
        num_q = self.policy.critic.num_q
        stacked = {}
        if critic['state']:
            for k in range(2):
                for layer in range(num_layers):
                    old = [critic['state'][m * 2 * num_layers + 2 * layer + k]
                           for m in range(num_q)]
                    # Weights (k = 0) are stored transposed: [in, out] per member.
                    stacked[k * num_layers + layer] = {
                        'step': old[0]['step'],
                        **{key: torch.stack([o[key].t() if k == 0 else o[key] for o in old])
                           for key in ('exp_avg', 'exp_avg_sq')}}
        actor = state['actor_optimizer']
        merged = dict(actor['state'])
        groups = self.actor_optimizer.state_dict()['param_groups']
        if len(groups) == 2 and state['ent_optimizer']['state']:
            merged[len(groups[0]['params'])] = state['ent_optimizer']['state'][0]
        return {**state,
                'critic_optimizer': {'state': stacked, 'param_groups': self.critic_optimizer
                                     .state_dict()['param_groups']},
                'actor_optimizer': {'state': merged, 'param_groups': groups}}
