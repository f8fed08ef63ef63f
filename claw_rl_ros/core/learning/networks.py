"""Actor-critic networks with a diagonal Gaussian policy and running observation normalisers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn
import torch.nn.functional as F

if TYPE_CHECKING:
    from .train_config import HistoryEncoderConfig

ACTIVATIONS = {'elu': nn.ELU, 'relu': nn.ReLU, 'tanh': nn.Tanh, 'selu': nn.SELU,
               'leaky_relu': nn.LeakyReLU}


def mlp(in_dim: int, hidden: list[int], out_dim: int, activation: str) -> nn.Sequential:
    """Linear layers with ``activation`` between them (none after the last)."""
    layers: list[nn.Module] = []
    dims = [in_dim, *hidden]
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), ACTIVATIONS[activation]()]
    layers.append(nn.Linear(dims[-1], out_dim))
    return nn.Sequential(*layers)


def mlp_forward(net: nn.Sequential, x: torch.Tensor, hidden_dtype: torch.dtype | None = None
                ) -> torch.Tensor:
    """``net(x)`` [B, out] for an :func:`mlp`, its hidden layers' matmuls in ``hidden_dtype``.

    ``None`` runs the stored float32 layers. ``torch.bfloat16`` casts the input, weights and
    biases of every layer but the last to bfloat16 (products accumulate in float32 inside the
    kernel; JAX's default matmul precision on TPU) and runs the output layer in float32, so the
    outputs keep float32 resolution. Gradients reach the float32 parameters through the casts.
    """
    if hidden_dtype is None:
        return net(x)
    *hidden, last = net
    h = x.to(hidden_dtype)
    for layer in hidden:
        h = F.linear(h, layer.weight.to(hidden_dtype), layer.bias.to(hidden_dtype)) \
            if isinstance(layer, nn.Linear) else layer(h)
    return F.linear(h.float(), last.weight, last.bias)


class HistoryActor(nn.Module):
    """An actor over a window of H policy frames of D values each: a 1D convolution over time
    encodes the memory, an MLP acts on the newest frame and that encoding.

    obs [..., H * D] (oldest frame first, as :class:`~..sim.observations.ObservationHistory`
    lays it out) -> frames [B, D, H] -> (a 1x1 convolution: per-frame embedding) -> convolutions
    over time -> latent [B, latent_dim]; actions [..., A] = head([newest frame, latent]).
    """

    def __init__(self, frame_dim: int, history: int, num_actions: int, hidden_dims: list[int],
                 activation: str, encoder: HistoryEncoderConfig):
        super().__init__()
        self.frame_dim, self.history = frame_dim, history
        if history < encoder.min_history:
            raise ValueError(f'history encoder: a window of {history} frames is shorter than '
                             f'its convolutions need ({encoder.min_history})')
        act = ACTIVATIONS[activation]
        layers: list[nn.Module] = []
        width = frame_dim
        if encoder.embed_dim:
            layers += [nn.Conv1d(frame_dim, encoder.embed_dim, 1), act()]
            width = encoder.embed_dim
        for channels, kernel, stride in zip(encoder.channels, encoder.kernel_sizes,
                                            encoder.strides):
            layers += [nn.Conv1d(width, channels, kernel, stride), act()]
            width = channels
        layers += [nn.Flatten(), nn.Linear(width * encoder.output_length(history),
                                           encoder.latent_dim), act()]
        self.encoder = nn.Sequential(*layers)
        self.head = mlp(frame_dim + encoder.latent_dim, hidden_dims, num_actions, activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        lead = obs.shape[:-1]
        # [..., H * D] -> [B, H, D] -> channels first [B, D, H] for the convolutions.
        frames = obs.reshape(-1, self.history, self.frame_dim)
        latent = self.encoder(frames.transpose(1, 2))
        out = self.head(torch.cat([frames[:, -1], latent], dim=-1))
        return out.reshape(*lead, out.shape[-1])


# Normaliser variants: (epsilon, clip). rsl_rl adds eps to the std; sb3 adds it to the variance.
NORMALIZER_VARIANTS = {'rsl_rl': (1e-2, None), 'sb3': (1e-8, 10.0)}


class EmpiricalNormalization(nn.Module):
    """Running mean / variance of inputs ``x [B, dim]``, two variants.

    - ``rsl_rl``: ``y = (x - mean) / (std + 1e-2)`` (rsl_rl).
    - ``sb3``: ``y = clip((x - mean) / sqrt(var + 1e-8), -10, 10)`` (SB3 VecNormalize, CleanRL
      NormalizeObservation).

    Statistics update only through :meth:`update` (called on collected observations), so the
    forward pass is a pure function that exports to ONNX.
    """

    def __init__(self, dim: int, eps: float | None = None, variant: str = 'rsl_rl'):
        super().__init__()
        if variant not in NORMALIZER_VARIANTS:
            raise ValueError(f'normaliser variant {variant!r}: use one of '
                             f'{", ".join(NORMALIZER_VARIANTS)}')
        self.variant = variant
        default_eps, self.clip = NORMALIZER_VARIANTS[variant]
        self.eps = default_eps if eps is None else eps
        self.register_buffer('mean', torch.zeros(dim))
        self.register_buffer('var', torch.ones(dim))
        self.register_buffer('count', torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.clip is None:
            return (x - self.mean) / (torch.sqrt(self.var) + self.eps)
        # SB3: the epsilon inside the root, then a clip of rare outliers.
        y = (x - self.mean) / torch.sqrt(self.var + self.eps)
        return y.clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge a batch ``x [B, dim]`` into the running statistics (parallel variance)."""
        x = x.reshape(-1, x.shape[-1])
        n = x.shape[0]
        if n == 0:
            return
        # Python scalars for the weights: no tensor round trip per call (sb3 calls this every
        # step); the tensor arithmetic below is the same as ever, bit for bit.
        total = self.count.item() + n
        w = n / total
        if n == 1:
            # One sample: its mean is itself and its variance 0 (the common per-step case).
            delta = x[0] - self.mean
            self.mean += w * delta
            self.var.copy_((1 - w) * self.var + w * (1 - w) * delta.square())
        else:
            batch_mean = x.mean(dim=0)
            batch_var = x.var(dim=0, unbiased=False)
            delta = batch_mean - self.mean
            # Chan et al.: combine (mean, var) of the old statistics and the batch.
            self.mean += w * delta
            self.var.copy_((1 - w) * self.var + w * batch_var + w * (1 - w) * delta.square())
        self.count.fill_(total)


LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def gaussian_log_prob(actions: torch.Tensor, mean: torch.Tensor,
                      std: torch.Tensor) -> torch.Tensor:
    """Diagonal-Gaussian log-density summed over action dims: [B, A] -> [B]."""
    # log N(a; mu, s) = -(a - mu)^2 / (2 s^2) - log s - log sqrt(2 pi)
    return (-(actions - mean).square() / (2.0 * std.square()) - std.log()
            - LOG_SQRT_2PI).sum(-1)


def sample_gaussian(mean: torch.Tensor, std: torch.Tensor,
                    generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The one Gaussian sampler of actors and learner: actions [B, A] ~ N(mean, std) and
    their log-densities [B]."""
    actions = torch.normal(mean, std, generator=generator)
    return actions, gaussian_log_prob(actions, mean, std)


def gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    """Diagonal-Gaussian entropy summed over action dims: [B, A] -> [B]."""
    # H = sum(1/2 + log sqrt(2 pi) + log s)
    return (0.5 + LOG_SQRT_2PI + std.log()).sum(-1)


def orthogonal_init_(net: nn.Sequential, output_gain: float) -> None:
    """SB3 / CleanRL init of an MLP: orthogonal weights, zero biases, gain sqrt 2 for hidden
    layers and ``output_gain`` for the last (0.01 for an action mean, 1 for a value)."""
    linears = [m for m in net if isinstance(m, nn.Linear)]
    for k, layer in enumerate(linears):
        nn.init.orthogonal_(layer.weight, gain=output_gain if k == len(linears) - 1
                            else math.sqrt(2.0))
        nn.init.zeros_(layer.bias)


def select_obs(obs: dict[str, torch.Tensor], groups: list[str]) -> torch.Tensor:
    """Concatenate observation groups ``[B, sum of dims]`` in the given order."""
    if len(groups) == 1:
        return obs[groups[0]]
    return torch.cat([obs[g] for g in groups], dim=-1)


class ActorCritic(nn.Module):
    """Gaussian actor ``N(mu(obs), diag(std^2))`` with a state-independent log std, and a critic.

    Shapes: actor obs [B, actor_dim] -> mean [B, A], std [A] broadcast to [B, A];
    critic obs [B, critic_dim] -> value [B, 1].
    """

    def __init__(self, actor_dim: int, critic_dim: int, num_actions: int, *,
                 actor_hidden_dims: list[int], critic_hidden_dims: list[int],
                 activation: str = 'elu', init_noise_std: float = 1.0,
                 normalize_obs: bool = True, actor_obs_groups: list[str] | None = None,
                 critic_obs_groups: list[str] | None = None, min_std: float = 0.0,
                 obs_normalizer: str = 'rsl_rl', init: str = 'torch',
                 history_encoder: HistoryEncoderConfig | None = None, history: int = 1):
        super().__init__()
        self.actor_obs_groups = list(actor_obs_groups or ['policy'])
        self.critic_obs_groups = list(critic_obs_groups or ['policy_noise_free', 'privileged'])
        if history_encoder is not None and history_encoder.enabled:
            # A window of ``history`` frames through a convolution, then the MLP.
            self.actor = HistoryActor(actor_dim // history, history, num_actions,
                                      actor_hidden_dims, activation, history_encoder)
        else:
            self.actor = mlp(actor_dim, actor_hidden_dims, num_actions, activation)
        self.critic = mlp(critic_dim, critic_hidden_dims, 1, activation)
        self.actor_normalizer = EmpiricalNormalization(actor_dim, variant=obs_normalizer) \
            if normalize_obs else nn.Identity()
        self.critic_normalizer = EmpiricalNormalization(critic_dim, variant=obs_normalizer) \
            if normalize_obs else nn.Identity()
        # sb3 statistics follow every step before it is acted on; rsl_rl's once per rollout.
        self.normalize_every_step = normalize_obs and obs_normalizer == 'sb3'
        if init == 'orthogonal':
            orthogonal_init_(getattr(self.actor, 'head', self.actor), output_gain=0.01)
            orthogonal_init_(self.critic, output_gain=1.0)
        elif init != 'torch':
            raise ValueError(f'init {init!r}: use torch or orthogonal')
        self.log_std = nn.Parameter(torch.full((num_actions,), math.log(init_noise_std)))
        self.min_std = min_std
        self.clamp_std_()

    def actor_input(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return select_obs(obs, self.actor_obs_groups)

    def critic_input(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return select_obs(obs, self.critic_obs_groups)

    def action_mean_std(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution parameters: mean [B, A], std [B, A]."""
        mean = self.actor(self.actor_normalizer(self.actor_input(obs)))
        std = torch.exp(self.log_std).expand_as(mean)
        return mean, std

    @torch.no_grad()
    def clamp_std_(self) -> None:
        """Keep the std parameter itself at or above ``min_std`` (after each optimizer step).

        Clamping the parameter, not the forward output, keeps the gradient alive at the floor:
        the loss and the entropy bonus can always raise a std that sits on it, and the std the
        actions are sampled with is exactly ``exp(log_std)``.
        """
        if self.min_std > 0.0:
            self.log_std.clamp_(min=math.log(self.min_std))

    def act_inference(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Deterministic action (the mean) [B, A]: what deployment runs."""
        return self.actor(self.actor_normalizer(self.actor_input(obs)))

    def evaluate(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """State value [B, 1]."""
        return self.critic(self.critic_normalizer(self.critic_input(obs)))

    def update_normalization(self, obs: dict[str, torch.Tensor]) -> None:
        """Merge ``obs`` into both normalisers (the critic's is a copy when it reads the same
        groups: same data, same statistics, half the work)."""
        if isinstance(self.actor_normalizer, EmpiricalNormalization):
            self.actor_normalizer.update(self.actor_input(obs))
            if self.critic_obs_groups == self.actor_obs_groups:
                for name in ('mean', 'var', 'count'):
                    getattr(self.critic_normalizer, name).copy_(
                        getattr(self.actor_normalizer, name))
            else:
                self.critic_normalizer.update(self.critic_input(obs))
