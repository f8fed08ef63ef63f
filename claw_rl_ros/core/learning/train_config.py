"""Typed configuration of a training run: env, policy, algorithm, distillation, runner."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from .. import paths
from ..config import ConfigError, from_dict, load_yaml, MAX_THREADS, merge, param
from ..sim.env_config import EnvConfig
from ..sim.observations import HEIGHT_SCAN, OBS_GROUPS, POLICY, POLICY_NOISE_FREE
from ..sim.terrain import EVAL_TERRAIN_SEED


@dataclass
class HistoryEncoderConfig:
    """A 1D convolution over the student's memory (``env.policy_history`` frames), as RMA's
    adaptation module and the temporal convolution of Lee et al. 2020: frames [B, H, D] ->
    (a per-frame embedding) -> convolutions over time -> latent [B, latent_dim], which the actor
    MLP reads beside the newest frame. Off (``channels: []``): the MLP reads the flattened
    window. Layer i uses ``channels[i]``, ``kernel_sizes[i]`` and ``strides[i]``."""

    channels: list[int] = param([], 'output channels of each convolution over time (empty: no '
                                    'encoder); e.g. [32, 32, 32] with env.policy_history 50',
                                ge=1, le=1024)
    kernel_sizes: list[int] = param([8, 5, 5], 'kernel of each convolution [frames]', ge=1)
    strides: list[int] = param([4, 1, 1], 'stride of each convolution [frames]', ge=1)
    embed_dim: int = param(0, 'per-frame embedding width (a 1x1 convolution, as RMA; 0: the '
                              'first convolution reads the frames; on a CPU the embedding of '
                              'every frame costs more than all the convolutions)', ge=0, le=1024)
    latent_dim: int = param(16, 'width of the memory latent the actor MLP reads', ge=1, le=1024)

    @property
    def enabled(self) -> bool:
        return bool(self.channels)

    def output_length(self, history: int) -> int:
        """Frames left after the convolutions over a ``history``-frame window (< 1: too short)."""
        length = history
        for _, kernel, stride in zip(self.channels, self.kernel_sizes, self.strides):
            # Valid convolution: floor((L - k) / s) + 1 outputs.
            length = (length - kernel) // stride + 1
        return length

    @property
    def min_history(self) -> int:
        """The shortest window the convolutions leave one frame of."""
        need = 1
        layers = list(zip(self.channels, self.kernel_sizes, self.strides))
        for _, kernel, stride in reversed(layers):
            # Invert floor((L - k) / s) + 1 >= need: L >= (need - 1) s + k.
            need = (need - 1) * stride + kernel
        return need

    def __post_init__(self):
        if not self.enabled:
            return
        for key in ('kernel_sizes', 'strides'):
            if len(getattr(self, key)) < len(self.channels):
                raise ConfigError('', key, f'{getattr(self, key)} gives fewer layers than '
                                  f'channels {self.channels}; give one per convolution')


@dataclass
class PolicyConfig:
    """Actor-critic networks (the student's actor is what gets exported)."""

    actor_hidden_dims: list[int] = param([128, 128, 128], 'actor MLP hidden sizes', ge=1)
    critic_hidden_dims: list[int] = param([256, 256, 128], 'critic MLP hidden sizes', ge=1)
    activation: Literal['elu', 'relu', 'tanh', 'selu', 'leaky_relu'] = param(
        'elu', 'hidden-layer activation')
    init_noise_std: float = param(1.0, 'initial action standard deviation', gt=0)
    min_noise_std: float = param(0.05, 'floor on the action std during training', ge=0)
    actor_obs_groups: list[str] = param(['policy'], 'observation groups the actor reads (a '
                                        'student: policy; a privileged teacher: '
                                        'policy_noise_free, privileged)')
    critic_obs_groups: list[str] = param(['policy_noise_free', 'privileged'],
                                         'groups the critic reads (noise-free by default)')
    normalize_obs: bool = param(True, 'running mean/std observation normaliser')
    obs_normalizer: Literal['rsl_rl', 'sb3'] = param(
        'rsl_rl', 'normaliser variant. rsl_rl: (x - mean) / (std + 1e-2), statistics merged once '
        'per rollout after the update. sb3: (x - mean) / sqrt(var + 1e-8) clipped to +-10, '
        'statistics merged at every step before acting (SB3 VecNormalize, CleanRL '
        'NormalizeObservation)')
    init: Literal['torch', 'orthogonal'] = param(
        'torch', 'weight init. torch: PyTorch default. orthogonal: SB3 / CleanRL (orthogonal '
        'weights, zero biases, gain sqrt 2 hidden, 0.01 action mean, 1 value)')
    history_encoder: HistoryEncoderConfig = param(
        HistoryEncoderConfig(), "the student's memory through a 1D convolution (off by default)")


@dataclass
class SymmetryConfig:
    """Left/right mirror symmetry (rsl_rl's symmetry module); needs the robot's mirror.swap."""

    data_augmentation: bool = param(False, 'append the mirror of every mini-batch (obs, '
                                           'actions; values, advantages, log-probs repeated)')
    mirror_loss_coef: float = param(0.0, 'weight of || mu(mirror(o)) - mirror(mu(o)) ||^2 in '
                                         'the loss (0 = off)', ge=0, le=1000)

    @property
    def enabled(self) -> bool:
        return self.data_augmentation or self.mirror_loss_coef > 0


@dataclass
class PPOConfig:
    """PPO hyper-parameters (rsl_rl defaults)."""

    num_learning_epochs: int = param(5, 'passes over each rollout', ge=1)
    num_mini_batches: int = param(4, 'mini-batches per pass', ge=1)
    clip_param: float = param(0.2, 'surrogate ratio clip', gt=0)
    gamma: float = param(0.99, 'discount', ge=0, le=1)
    lam: float = param(0.95, 'GAE lambda', ge=0, le=1)
    value_loss_coef: float = param(1.0, 'value loss weight', ge=0)
    entropy_coef: float = param(0.01, 'entropy bonus weight', ge=0)
    learning_rate: float = param(1e-3, 'Adam learning rate (initial, if adaptive)', gt=0)
    max_grad_norm: float = param(1.0, 'gradient-norm clip', gt=0)
    use_clipped_value_loss: bool = param(True, 'clip the value update like the policy')
    schedule: Literal['adaptive', 'fixed', 'linear'] = param(
        'adaptive', 'learning-rate schedule: adaptive (rsl_rl, from the KL), fixed, or linear '
        '(CleanRL anneal_lr: learning_rate x (1 - iteration / runner.max_iterations))')
    # Bounded: a target of a nat or more is no trust region at all.
    desired_kl: float = param(0.01, 'target KL of the adaptive schedule', gt=0, le=1)
    normalize_advantage_per_mini_batch: bool = param(False, 'else over the whole rollout')
    adam_eps: float = param(1e-8, 'Adam epsilon (PyTorch 1e-8; SB3 / CleanRL PPO use 1e-5)',
                            gt=0)
    symmetry: SymmetryConfig = param(SymmetryConfig(), 'mirror symmetry (off by default)')


@dataclass
class SACConfig:
    """SAC hyper-parameters; defaults are stable-baselines3's SAC (CleanRL's sac_continuous_action
    where SB3 has none: the [-5, 2] log-std range; learning_starts is CleanRL's 5e3, SB3 uses
    100). Network sizes come from ``policy`` (SB3 / CleanRL use [256, 256] relu)."""

    buffer_size: int = param(1_000_000, 'replay capacity in transitions (SB3 1e6)', ge=1)
    learning_starts: int = param(5000, 'uniform random actions and no updates for this many '
                                       'transitions (CleanRL 5e3, SB3 100)', ge=0)
    batch_size: int = param(256, 'transitions per gradient step (SB3 256)', ge=1)
    utd_ratio: float = param(1.0, 'gradient steps per collected transition (SB3 train_freq=1, '
                                  'gradient_steps=1: 1.0; many worlds want less)', gt=0)
    gamma: float = param(0.99, 'discount (SB3 0.99)', ge=0, le=1)
    tau: float = param(0.005, 'Polyak rate of the target critics (SB3 0.005)', gt=0, le=1)
    target_update_interval: int = param(1, 'gradient steps between target updates (SB3 1)',
                                        ge=1)
    actor_lr: float = param(3e-4, 'actor Adam learning rate (SB3 3e-4)', gt=0)
    critic_lr: float = param(3e-4, 'critic Adam learning rate (SB3 3e-4; CleanRL 1e-3)', gt=0)
    ent_coef_lr: float = param(3e-4, 'temperature Adam learning rate (SB3 3e-4)', gt=0)
    init_ent_coef: float = param(1.0, 'initial entropy temperature (SB3 auto_1.0)', gt=0)
    auto_ent_coef: bool = param(True, 'tune the temperature towards target_entropy (SB3 auto)')
    target_entropy: Optional[float] = param(None, 'target policy entropy (None = -|A|, SB3)')
    n_step: int = param(1, 'n-step returns (1 = plain SAC)', ge=1)
    max_grad_norm: float = param(0.0, 'gradient-norm clip of actor and critic (0 = none, '
                                      'SB3)', ge=0)
    action_bound: float = param(1.0, 'envs without a bounded action space (the claw env) get '
                                     'actions in +-action_bound; Gymnasium envs use theirs', gt=0)
    checkpoint_replay: bool = param(True, 'save the replay buffer in checkpoints (exact '
                                          'resume; large files)')
    matmul_dtype: Literal['float32', 'bfloat16', 'auto'] = param(
        'float32', 'dtype of the hidden layers\' matmuls in the gradient steps: bfloat16 '
                   '(float32 accumulation and output layers, float32 weights and Adam) is ~4x '
                   'faster per product on CPUs with AVX512-BF16 or AMX; auto = bfloat16 there, '
                   'else float32; acting and the exported student stay float32')


@dataclass
class DistillationConfig:
    """Online policy distillation: loss = RL loss + alpha * KL(teacher || student)."""

    alpha: float = param(0.0, 'distillation weight (0 = plain PPO)', ge=0)
    alpha_final: Optional[float] = param(None, 'alpha at the end of the schedule (None = '
                                               'constant)', ge=0)
    alpha_schedule_iterations: int = param(0, 'iterations to move alpha to alpha_final', ge=0)
    teacher_mode: Literal['none', 'ema', 'frozen'] = param(
        'none', 'none (plain PPO), ema (teacher = EMA of the student) or frozen (loaded from '
        'teacher_checkpoint)')
    ema_decay: float = param(0.995, 'teacher <- decay * teacher + (1 - decay) * student',
                             ge=0, le=1)
    teacher_checkpoint: Optional[str] = param(None, 'checkpoint of a frozen teacher')


@dataclass
class SelectionConfig:
    """Deploy the best of the last students, not only the final one: every ``every_s`` of
    training a snapshot of the student is kept (``candidates/model_<iteration>.pt``, the
    ``candidates`` newest), and at the end of the run they and the final student are evaluated
    on a validation set, the end-of-run evaluation's ground and command on a map of its own
    (``terrain_seed``) with env seeds of its own (``env_seeds``); the winner becomes
    ``student.onnx``. PPO's last iterations wander (the final student of a long terrain run
    can be worse than one pushed four minutes earlier), and a validation evaluation that
    neither trains nor tests is the usual cure (checkpoint selection)."""

    candidates: int = param(0, 'earlier snapshots that compete with the final student (0: the '
                               'final student is exported, nothing is evaluated twice)',
                            ge=0, le=20)
    every_s: float = param(240.0, 'training wall time between snapshots [s]', ge=0.001)
    env_seeds: list[int] = param([5, 6], 'env seeds of the validation evaluation '
                                         '(randomisation, noise, pushes), one evaluation each; '
                                         'not runner.seed + 1, the end-of-run table\'s',
                                 ge=0, le=2**31 - 1)
    terrain_seed: int = param(1001, 'terrain map of the validation evaluation; neither '
                                    'env.terrain.seed (training) nor 1000 (the evaluation map '
                                    'of the end-of-run table, claw-rl eval and the bench)',
                              ge=0, le=2**31 - 1)


@dataclass
class RunnerConfig:
    """The training loop: rollout length, budget, logging and checkpoints."""

    num_steps_per_env: int = param(24, 'control steps per world per iteration', ge=1)
    max_iterations: int = param(1000, 'training iterations', ge=1)
    time_budget_s: float = param(0.0, 'stop after this wall time (0 = no limit)', ge=0)
    save_interval: int = param(50, 'iterations between checkpoints', ge=1)
    keep_checkpoints: int = param(3, 'newest checkpoints kept, the last one included', ge=1)
    seed: int = param(1, 'seed of torch, numpy and the env (actor i of the train graph: '
                      'seed x 1000 + i)', ge=0, le=2**31 - 1)
    torch_threads: int = param(0, 'torch intra-op threads (0 = cores)', ge=0,
                               le=MAX_THREADS)
    run_dir: str = param('runs', 'parent folder of run directories')
    run_name: str = param('', 'run directory name (empty = time stamp)')
    log_interval: int = param(1, 'iterations between progress lines', ge=1)
    eval_episodes: int = param(20, 'episodes of the evaluation after training (0 = none)', ge=0)
    selection: SelectionConfig = param(SelectionConfig(), 'which student is exported: the '
                                       'final one, or the best of the last on validation')


@dataclass
class TrainConfig:
    """Everything a training run needs; written resolved into its run directory."""

    algorithm: Literal['ppo', 'sac'] = param('ppo', 'training algorithm (ppo or sac); only '
                                                    'the trainer changes')
    env: EnvConfig = param(EnvConfig(), 'environment')
    gym_env: str = param('', 'train on this Gymnasium env id (Box actions) instead of the robot; '
                             'it uses env.num_envs copies and runner.seed, the rest of env is '
                             'unused')
    policy: PolicyConfig = param(PolicyConfig(), 'networks')
    ppo: PPOConfig = param(PPOConfig(), 'PPO')
    sac: SACConfig = param(SACConfig(), 'SAC (used when algorithm is sac)')
    distillation: DistillationConfig = param(DistillationConfig(), 'online distillation')
    runner: RunnerConfig = param(RunnerConfig(), 'loop, logging, checkpoints')

    def __post_init__(self):
        d = self.distillation
        if d.teacher_mode == 'none' and (d.alpha > 0 or (d.alpha_final or 0) > 0):
            raise ConfigError('', 'distillation.alpha', f'alpha is {d.alpha} but teacher_mode is '
                              'none; choose teacher_mode ema or frozen, or set alpha to 0')
        if d.teacher_mode == 'frozen' and not d.teacher_checkpoint:
            raise ConfigError('', 'distillation.teacher_checkpoint', 'teacher_mode is frozen '
                              'but no teacher checkpoint is given; set it or pass --teacher')
        if d.alpha_final is not None and d.alpha_schedule_iterations == 0:
            raise ConfigError('', 'distillation.alpha_schedule_iterations', 'alpha_final is set '
                              'but the schedule has 0 iterations; give its length')
        if self.algorithm == 'sac' and self.ppo.symmetry.enabled:
            raise ConfigError('', 'ppo.symmetry', 'mirror symmetry is a PPO option; turn it off '
                              'or set algorithm: ppo')
        if self.algorithm == 'sac':
            for key, default in (('obs_normalizer', 'rsl_rl'), ('init', 'torch')):
                if getattr(self.policy, key) != default:
                    raise ConfigError('', f'policy.{key}', f'{getattr(self.policy, key)!r} is a '
                                      f'PPO option; SAC uses {default}: remove the key or set '
                                      'algorithm: ppo')
        for key in ('actor_obs_groups', 'critic_obs_groups'):
            groups = getattr(self.policy, key)
            for group in groups:
                if group not in OBS_GROUPS:
                    raise ConfigError('', f'policy.{key}', f'unknown group {group!r}; use '
                                      f'{", ".join(OBS_GROUPS)}')
            if len(set(groups)) != len(groups) or not groups:
                raise ConfigError('', f'policy.{key}', f'{groups} must list each group once')
        scan = self.env.terrain.enabled and self.env.terrain.height_scan.enabled
        for key in ('actor_obs_groups', 'critic_obs_groups'):
            if HEIGHT_SCAN in getattr(self.policy, key) and not scan and not self.gym_env:
                raise ConfigError('', f'policy.{key}', f'reads {HEIGHT_SCAN!r}, but the env has '
                                  'no height scan; set env.terrain.enabled and '
                                  'env.terrain.height_scan.enabled to true, or drop the group')
        self.check_history_encoder()
        self.check_selection()
        if self.policy.actor_obs_groups[0] not in (POLICY, POLICY_NOISE_FREE):
            raise ConfigError('', 'policy.actor_obs_groups', 'must start with policy (a '
                              'student) or policy_noise_free (a privileged teacher)')

    def check_selection(self) -> None:
        """Selection picks among exported students, judged on a set of its own."""
        sel = self.runner.selection
        if not sel.candidates:
            return
        if self.gym_env or self.policy.actor_obs_groups != [POLICY]:
            raise ConfigError('', 'runner.selection.candidates', f'{sel.candidates}, but it '
                              'picks the exported student of the robot env and this actor reads '
                              f'{self.policy.actor_obs_groups}' + (f' of {self.gym_env}'
                                                                   if self.gym_env else '')
                              + '; set it to 0')
        if not sel.env_seeds or len(set(sel.env_seeds)) != len(sel.env_seeds):
            raise ConfigError('', 'runner.selection.env_seeds', f'{sel.env_seeds}: give one or '
                              'more distinct seeds, e.g. [5, 6]')
        if self.runner.seed + 1 in sel.env_seeds:
            raise ConfigError('', 'runner.selection.env_seeds', f'{sel.env_seeds} holds '
                              f'{self.runner.seed + 1}, the env seed of the end-of-run table '
                              '(runner.seed + 1): the pick would be judged on what picked it; '
                              'use other seeds')
        taken = {EVAL_TERRAIN_SEED: 'the evaluation map (claw-rl eval, the bench, the '
                 'end-of-run table)', self.env.terrain.seed: 'the training map (env.terrain.seed)'}
        if sel.terrain_seed in taken:
            free = next(seed for seed in (EVAL_TERRAIN_SEED + 1, EVAL_TERRAIN_SEED + 2)
                        if seed not in taken)
            raise ConfigError('', 'runner.selection.terrain_seed', f'{sel.terrain_seed} is '
                              f'{taken[sel.terrain_seed]}; give a map of its own, e.g. {free}')

    def check_history_encoder(self) -> None:
        """The encoder reads a window of policy frames: a PPO student on ``[policy]`` whose
        ``env.policy_history`` outlasts the convolutions."""
        enc = self.policy.history_encoder
        if not enc.enabled:
            return
        if self.algorithm != 'ppo' or self.gym_env:
            raise ConfigError('', 'policy.history_encoder', 'reads the robot env\'s policy '
                              'frames with PPO; set channels: [] for SAC or a Gymnasium task')
        if self.policy.actor_obs_groups != [POLICY]:
            raise ConfigError('', 'policy.history_encoder', f'reads the window of {POLICY!r} '
                              f'alone, but the actor reads {self.policy.actor_obs_groups}; set '
                              'policy.actor_obs_groups: [policy] or channels: []')
        history = self.env.policy_history
        if history < enc.min_history:
            raise ConfigError('', 'policy.history_encoder', f'kernels {enc.kernel_sizes} and '
                              f'strides {enc.strides} need a window of {enc.min_history} frames '
                              f'or more, env.policy_history is {history}; raise '
                              'env.policy_history (e.g. 50) or use smaller kernels')


def parse_overrides(items: list[str], source: str = '--set') -> dict:
    """``['a.b=1', 'c=[1, 2]']`` -> ``{'a': {'b': 1}, 'c': [1, 2]}`` (values parsed as YAML):
    ``claw-rl train --set``, the train graph's ``set`` and the nodes it starts share it."""
    import yaml
    out: dict = {}
    for item in items:
        key, sep, value = item.partition('=')
        if not sep or not key:
            raise ConfigError(source, item, 'expected KEY=VALUE, e.g. runner.max_iterations=10')
        node = out
        parts = key.split('.')
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(source, item, f'{part} is set to a value above; give each '
                                  'key once')
        try:
            node[parts[-1]] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            problem = getattr(exc, 'problem', None) or type(exc).__name__
            raise ConfigError(source, item, f'the value {value!r} is not valid YAML ({problem}); '
                              'a list is written [1, 2] (in `claw-rl up --set` and `set:=` items '
                              'are split at spaces: [1,2], or quote the whole item)') from None
    return out


def split_overrides(text: str, source: str = 'set') -> dict:
    """The train graph's ``set`` argument (``KEY=VALUE`` items separated by spaces, shell
    quoting for values with spaces) as an overrides dict."""
    import shlex
    try:
        items = shlex.split(text or '')
    except ValueError as exc:  # unbalanced quotes
        raise ConfigError(source, text, f'not a list of KEY=VALUE items ({exc})') from None
    return parse_overrides(items, source)


def with_teacher(overrides: dict, teacher: str | Path) -> dict:
    """``overrides`` plus a frozen OPD teacher from checkpoint ``teacher`` (``--teacher``): its
    other distillation keys (alpha, schedule) stay."""
    return merge(overrides, {'distillation': {'teacher_mode': 'frozen',
                                              'teacher_checkpoint': str(Path(teacher).resolve())}})


def load_train_config(path: str | Path, overrides: dict | None = None) -> TrainConfig:
    """Read a train YAML (optionally patched by ``overrides``) into a TrainConfig."""
    resolved = paths.config_path(str(path))
    data = load_yaml(resolved)
    if overrides:
        data = merge(data, overrides)
    return from_dict(TrainConfig, data, source=str(resolved))
