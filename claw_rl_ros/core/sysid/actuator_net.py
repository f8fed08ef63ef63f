"""A learned actuator model (Hwangbo et al. 2019), fitted on a recording with effort.

``claw-rl actuator-net`` trains a small MLP (2 hidden layers of 32 softsign units by default)
from the history of one joint's position error (target - q) and velocity to its measured effort,
shared by every joint (the ``network`` actuator runs one network for all of them), and writes
it as ONNX in the contract of :class:`~claw_rl_ros.core.sim.actuator.LearnedActuator` (input
``history`` [B, 2 H], newest first; output ``torque``; metadata ``claw_rl_actuator``). Beside
it, the PD fit: per joint group, Kp and Kd by non-negative least squares on the same training
data for each command delay of 0..H-1 physics steps, the delay with the least training error
kept, its prediction clipped at the effort limit (what ``ideal_pd`` would apply). Both are
scored on the held-out last ``held_out`` of the recording in time (RMS effort error per joint
group and overall); the net trains on the part before it, early stopping on the training
part's own last ``stop_fraction`` (the held-out part never steers the fit).

The rate rule. The network runs at the physics rate (``sim_dt``, 5 ms on the claw), so its
history is H samples ``sim_dt`` apart; a recording samples joint states at the 50 Hz control
rate (a real driver may publish faster). Each recorded state sample k with effort is one
training sample; its history is read at the times t_k - (L + i) sim_dt, i = 0..H-1:

- q and qd by cubic Hermite interpolation of the samples (positions with their own
  velocities as slopes; qd is the interpolant's derivative), exact at the samples,
- the target as the zero-order hold of the commands at the times they took over (a trace's
  ``target[k]`` is in force from t_k on),

where L = ``effort_lag``, the physics steps the recorded effort trails the recorded state
(the sim node's torque sensors are read at the start of its last physics step: 1). A
recording at the physics rate (a fast driver, a robot YAML with decimation 1) gives its own
samples back; a 50 Hz one gives physics-rate histories with the commands' steps where they
were. Its limits: the positions between two samples are an interpolation, so a joint that
rings faster than a few Hz (the claw's calves on a stand, ~10 Hz) is learned from inputs a few
milliradians off (the PD fit of an ideal PD drive comes out up to ~12 % stiff at 50 Hz, exact
at the physics rate); and the efforts are all sampled at one phase of the control period, so a
delay is told apart only to within a control period. Record joint states and effort at the
physics rate where the driver can. A sample whose history reaches before the first state or
command is dropped. The drive's delay lies within the history the network sees (give H
physics steps beyond it), so the robot running the network should carry no extra
``actuator.delay_steps`` for it.
"""

from __future__ import annotations

from dataclasses import dataclass
import json
from pathlib import Path
import time

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto
import onnxruntime as ort
from scipy.optimize import nnls
import torch
from torch import nn

from ..config import ConfigError, param
from ..control.excitation import joint_sets
from ..io import atomic_write_bytes
from ..sim.actuator import (ACTUATOR_NET_INPUT, ACTUATOR_NET_OUTPUT, actuator_net_metadata,
                            MAX_NET_HISTORY)
from ..sim.robot_spec import RobotSpec
from .trace import Trace

# metadata_props key of the fit's report (JSON) beside the runtime contract's key.
FIT_KEY = 'claw_rl_actuator_fit'
# The fewest recorded state samples with a full history a fit accepts (2 s at 50 Hz).
MIN_SAMPLES = 100
# onnxruntime vs torch on the held-out inputs: the most they may differ [N m].
PARITY_TOLERANCE = 1e-3


@dataclass
class ActuatorNetConfig:
    """The network, its training and the held-out split (defaults: Hwangbo et al.'s size)."""

    history: int = param(8, 'physics steps of error and velocity the network reads (8 = 40 ms '
                            'at 5 ms); longer than the drive\'s delay', ge=1,
                         le=MAX_NET_HISTORY)
    hidden: int = param(32, 'units per hidden layer', ge=2, le=512)
    layers: int = param(2, 'hidden layers (softsign)', ge=1, le=4)
    epochs: int = param(300, 'most passes over the training samples', ge=1, le=100000)
    batch_size: int = param(256, 'samples per gradient step', ge=1, le=1 << 20)
    lr: float = param(3e-3, 'Adam learning rate', gt=0, le=1)
    patience: int = param(30, 'epochs without a better early-stopping error before stopping',
                          ge=1, le=100000)
    held_out: float = param(0.2, 'last fraction of the recording (in time) held out and '
                                 'scored', gt=0, lt=1)
    stop_fraction: float = param(0.15, 'last fraction of the training part that steers early '
                                       'stopping', gt=0, lt=1)
    seed: int = param(0, 'seed of the initial weights and the batch order', ge=0)
    effort_lag: int = param(1, 'physics steps the recorded effort trails the recorded state: '
                               '1 for the sim node (its torque sensors are read at the start '
                               'of its last physics step), 0 for a driver that samples current '
                               'and position together', ge=0, le=MAX_NET_HISTORY)


@dataclass
class HistoryWindows:
    """Physics-rate histories of each recorded sample (newest first), arrays [S, J, H]."""

    t: np.ndarray          # [S] sample times [s]
    target: np.ndarray     # [S, J, H] command in force at t - (effort_lag + i) sim_dt
    q: np.ndarray          # [S, J, H] position then
    qd: np.ndarray         # [S, J, H] velocity then
    effort: np.ndarray     # [S, J] effort recorded at t

    @property
    def inputs(self) -> np.ndarray:
        """[S, J, 2 H] float32 the network's input: position errors then velocities."""
        return np.concatenate([self.target - self.q, self.qd], axis=2).astype(np.float32)

    def part(self, rows: slice | np.ndarray) -> 'HistoryWindows':
        return HistoryWindows(self.t[rows], self.target[rows], self.q[rows], self.qd[rows],
                              self.effort[rows])


@dataclass
class PdFit:
    """The fitted PD law of one joint group: tau = Kp (target(t - delay) - q) - Kd qd."""

    kp: float
    kd: float
    delay_steps: int


@dataclass
class ActuatorNetReport:
    """Held-out RMS effort errors [N m] of the net and the PD fit, by group and 'all'."""

    groups: dict[str, list[str]]
    net_rms: dict[str, float]
    pd_rms: dict[str, float]
    pd_fit: dict[str, PdFit]
    samples: dict[str, int]
    epochs: int
    best_epoch: int
    train_s: float
    parity: float = 0.0
    history: int = 0
    physics_dt: float = 0.0

    def to_dict(self) -> dict:
        return {'net_rms': self.net_rms, 'pd_rms': self.pd_rms,
                'pd_fit': {g: vars(f) for g, f in self.pd_fit.items()},
                'samples': self.samples, 'epochs': self.epochs, 'best_epoch': self.best_epoch,
                'train_s': round(self.train_s, 3), 'parity_max_abs_diff': self.parity,
                'history': self.history, 'physics_dt': self.physics_dt}


# ----------------------------------------------------------------------------- the rate rule
def hermite(t: np.ndarray, q: np.ndarray, qd: np.ndarray,
            at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cubic Hermite interpolation of samples ``q`` [T, J] with slopes ``qd`` [T, J] at times
    ``t`` [T] (increasing), evaluated at ``at`` [M] within [t_0, t_-1]; (q, qd) [M, J]."""
    i = np.clip(np.searchsorted(t, at, side='right') - 1, 0, len(t) - 2)
    h = (t[i + 1] - t[i])[:, None]
    s = (at - t[i])[:, None] / h
    p0, p1, m0, m1 = q[i], q[i + 1], qd[i] * h, qd[i + 1] * h
    # The Hermite basis and its derivative in s (divided by h for d/dt).
    s2, s3 = s * s, s * s * s
    pos = (2 * s3 - 3 * s2 + 1) * p0 + (s3 - 2 * s2 + s) * m0 + (-2 * s3 + 3 * s2) * p1 \
        + (s3 - s2) * m1
    vel = ((6 * s2 - 6 * s) * p0 + (3 * s2 - 4 * s + 1) * m0 + (-6 * s2 + 6 * s) * p1
           + (3 * s2 - 2 * s) * m1) / h
    return pos, vel


def history_windows(t: np.ndarray, q: np.ndarray, qd: np.ndarray, effort: np.ndarray,
                    command_t: np.ndarray, command: np.ndarray, sim_dt: float,
                    history: int, effort_lag: int = 1) -> HistoryWindows:
    """Each state sample's physics-rate history (the module doc's rate rule).

    Args:
        t: [T] state sample times [s], increasing.
        q, qd, effort: [T, J] joint positions, velocities and measured efforts at ``t``.
        command_t: [C] times the commands took over [s], increasing.
        command: [C, J] the targets in force from then on.
        sim_dt: the physics step [s] the history is sampled at.
        history: H, samples of history.
        effort_lag: physics steps the effort trails the state: sample k's history ends at
            t_k - effort_lag sim_dt, where its effort was applied.
    """
    t = np.asarray(t, np.float64)
    command_t = np.asarray(command_t, np.float64)
    # A tolerance of 1e-6 steps: a history time on a sample's stamp reads that sample.
    eps = 1e-6 * sim_dt
    lags = sim_dt * (effort_lag + np.arange(history))
    # Interpolation needs two samples; a history that reaches before them is dropped.
    first = max(t[0], command_t[0]) - eps if len(t) > 1 and len(command_t) else np.inf
    keep = np.flatnonzero(t - lags[-1] >= first)
    at = (t[keep][:, None] - lags[None, :]).reshape(-1)      # [S H] newest first per sample
    j, s = q.shape[1], len(keep)
    pos, vel = hermite(t, q, qd, at) if s else (np.zeros((0, j)), np.zeros((0, j)))
    # Zero-order hold of the commands: the one last given at or before each time.
    c = np.searchsorted(command_t, at + eps, side='right') - 1
    target = command[np.maximum(c, 0)]

    def shaped(x):
        return x.reshape(s, history, j).transpose(0, 2, 1)
    return HistoryWindows(t[keep], shaped(target), shaped(pos), shaped(vel), effort[keep])


def trace_windows(trace: Trace, robot: RobotSpec, cfg: ActuatorNetConfig) -> HistoryWindows:
    """The windows of a trace's excitation samples (histories may reach before it): the
    trace's ``target[k]`` is in force from sample k on, so the commands take over at ``t``."""
    effort = check_effort(trace.effort, trace.source)
    windows = history_windows(trace.t, trace.q, trace.qd, effort, trace.t, trace.target,
                              robot.sim_dt, cfg.history, cfg.effort_lag)
    i0, i1 = trace.window
    inside = (windows.t >= trace.t[i0]) & (windows.t <= trace.t[max(i1 - 1, i0)])
    return windows.part(inside)


def check_effort(effort: np.ndarray | None, source: str) -> np.ndarray:
    """The recording's [T, J] efforts, refused by name when absent or not finite."""
    if effort is None or np.size(effort) == 0:
        raise ConfigError(source, 'joint_states.effort', 'the recording carries no effort; '
                          'a learned actuator needs the measured torque (record a driver that '
                          'publishes effort, or identify a PD model with claw-rl sysid)')
    effort = np.asarray(effort, np.float64)
    bad = ~np.isfinite(effort)
    if bad.any():
        k = int(np.argwhere(bad)[0][0])
        raise ConfigError(source, 'joint_states.effort', f'{int(bad.sum())} NaN or infinite '
                          f'values (first at sample {k}); record again or cut the bad part')
    return effort


def split(windows: HistoryWindows, cfg: ActuatorNetConfig,
          source: str) -> tuple[HistoryWindows, HistoryWindows, HistoryWindows]:
    """(train, early stopping, held out): the held-out last part of the recording in time,
    the early-stopping slice the last part of what is before it; too short is refused."""
    n = len(windows.t)
    if n < MIN_SAMPLES:
        raise ConfigError(source, 'joint_states', f'too short: {n} samples with a full '
                          f'{cfg.history}-step history, at least {MIN_SAMPLES} needed; record '
                          'a longer excitation (claw-rl sysid\'s runs tens of seconds)')
    cut = int(round(n * (1 - cfg.held_out)))
    stop = int(round(cut * (1 - cfg.stop_fraction)))
    return (windows.part(slice(0, stop)), windows.part(slice(stop, cut)),
            windows.part(slice(cut, n)))


# ------------------------------------------------------------------------------- the PD fit
def fit_pd(train: HistoryWindows, groups: dict[str, np.ndarray]) -> dict[str, PdFit]:
    """Per group (name: [J] bool), Kp >= 0 and Kd >= 0 by least squares for each command
    delay of 0..H-1 physics steps; the delay with the least RMS error is kept."""
    out = {}
    for name, mask in groups.items():
        tau = train.effort[:, mask].reshape(-1)
        qd = train.qd[:, mask, 0].reshape(-1)
        best = None
        for d in range(train.q.shape[2]):
            # tau = Kp (target(t - d) - q(t)) - Kd qd(t): linear in (Kp, Kd).
            error = (train.target[:, mask, d] - train.q[:, mask, 0]).reshape(-1)
            a = np.stack([error, -qd], axis=1)
            (kp, kd), residual = nnls(a, tau)
            if best is None or residual < best[0]:
                best = (residual, PdFit(float(kp), float(kd), d))
        out[name] = best[1]
    return out


def pd_effort(windows: HistoryWindows, groups: dict[str, np.ndarray],
              fits: dict[str, PdFit], effort_limit: np.ndarray) -> np.ndarray:
    """[S, J] the PD fit's efforts, clipped at the [J] effort limit."""
    out = np.zeros_like(windows.effort)
    for name, mask in groups.items():
        f = fits[name]
        error = windows.target[:, mask, f.delay_steps] - windows.q[:, mask, 0]
        out[:, mask] = f.kp * error - f.kd * windows.qd[:, mask, 0]
    return np.clip(out, -effort_limit, effort_limit)


# ------------------------------------------------------------------------------- the network
class ActuatorMlp(nn.Module):
    """x [B, 2 H] -> torque [B, 1]: normalise, softsign MLP, scale back to N m."""

    def __init__(self, history: int, hidden: int, layers: int, mean: np.ndarray,
                 std: np.ndarray, scale: float):
        super().__init__()
        sizes = [2 * history] + [hidden] * layers
        parts: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            parts += [nn.Linear(a, b), nn.Softsign()]
        self.body = nn.Sequential(*parts, nn.Linear(sizes[-1], 1))
        self.register_buffer('mean', torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer('std', torch.as_tensor(std, dtype=torch.float32))
        self.scale = float(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body((x - self.mean) / self.std) * self.scale


def train_net(train: HistoryWindows, stop: HistoryWindows,
              cfg: ActuatorNetConfig) -> tuple[ActuatorMlp, int, int]:
    """(the network at its best early-stopping error, epochs run, best epoch)."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.from_numpy(train.inputs.reshape(-1, 2 * cfg.history))
    y = torch.from_numpy(train.effort.reshape(-1, 1).astype(np.float32))
    xs = torch.from_numpy(stop.inputs.reshape(-1, 2 * cfg.history))
    ys = torch.from_numpy(stop.effort.reshape(-1, 1).astype(np.float32))
    # Inputs to zero mean and unit spread, the output in units of the efforts' spread.
    mean, std = x.mean(0).numpy(), np.maximum(x.std(0).numpy(), 1e-6)
    scale = max(float(y.std()), 1e-3)
    net = ActuatorMlp(cfg.history, cfg.hidden, cfg.layers, mean, std, scale)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
    best, best_epoch, best_state, epoch = np.inf, 0, None, 0
    for epoch in range(1, cfg.epochs + 1):
        order = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), cfg.batch_size):
            idx = order[i:i + cfg.batch_size]
            loss = torch.mean(((net(x[idx]) - y[idx]) / scale) ** 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            err = float(torch.mean((net(xs) - ys) ** 2))
        if err < best:
            best, best_epoch = err, epoch
            best_state = {k: v.clone() for k, v in net.state_dict().items()}
        elif epoch - best_epoch >= cfg.patience:
            break
    net.load_state_dict(best_state)
    return net.eval(), epoch, best_epoch


def net_effort(net: ActuatorMlp, windows: HistoryWindows) -> np.ndarray:
    """[S, J] the network's efforts (torch)."""
    s, j, w = windows.inputs.shape
    with torch.no_grad():
        out = net(torch.from_numpy(windows.inputs.reshape(-1, w)))
    return out.numpy().reshape(s, j).astype(np.float64)


def rms_by_group(predicted: np.ndarray, measured: np.ndarray,
                 groups: dict[str, np.ndarray]) -> dict[str, float]:
    """RMS of [S, J] ``predicted - measured`` over each group's joints, and 'all'."""
    err = predicted - measured
    out = {name: float(np.sqrt(np.mean(err[:, mask] ** 2))) for name, mask in groups.items()}
    out['all'] = float(np.sqrt(np.mean(err ** 2)))
    return out


# ----------------------------------------------------------------------------------- export
def onnx_model(net: ActuatorMlp, history: int, physics_dt: float,
               extra: dict[str, str] | None = None) -> onnx.ModelProto:
    """The network as ONNX in the LearnedActuator contract: the normaliser folded into the
    first layer, the output scale into the last (Gemm and Softsign nodes)."""
    linears = [m for m in net.body if isinstance(m, nn.Linear)]
    weights = [m.weight.detach().double().numpy() for m in linears]
    biases = [m.bias.detach().double().numpy() for m in linears]
    mean, std = net.mean.double().numpy(), net.std.double().numpy()
    # W (x - m) / s + b = (W / s) x + (b - (W / s) m); the last layer times the scale.
    weights[0] = weights[0] / std[None, :]
    biases[0] = biases[0] - weights[0] @ mean
    weights[-1], biases[-1] = weights[-1] * net.scale, biases[-1] * net.scale
    nodes, inits, last = [], [], ACTUATOR_NET_INPUT
    for k, (w, b) in enumerate(zip(weights, biases)):
        out = ACTUATOR_NET_OUTPUT if k == len(weights) - 1 else f'h{k}'
        inits += [numpy_helper.from_array(w.astype(np.float32), f'w{k}'),
                  numpy_helper.from_array(b.astype(np.float32), f'b{k}')]
        gemm = f'g{k}' if out != ACTUATOR_NET_OUTPUT else out
        nodes.append(helper.make_node('Gemm', [last, f'w{k}', f'b{k}'], [gemm], transB=1))
        if out != ACTUATOR_NET_OUTPUT:
            nodes.append(helper.make_node('Softsign', [gemm], [out]))
        last = out
    graph = helper.make_graph(
        nodes, 'actuator_net',
        [helper.make_tensor_value_info(ACTUATOR_NET_INPUT, TensorProto.FLOAT,
                                       ['B', 2 * history])],
        [helper.make_tensor_value_info(ACTUATOR_NET_OUTPUT, TensorProto.FLOAT, ['B', 1])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)])
    model.producer_name = 'claw_rl_ros'
    model.doc_string = ('learned actuator: torque [N m] from the history of position error '
                        'and velocity, newest first (core/sim/actuator.py)')
    for key, value in {**actuator_net_metadata(history, physics_dt), **(extra or {})}.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model)
    return model


def parity(model: onnx.ModelProto, net: ActuatorMlp, windows: HistoryWindows) -> float:
    """Largest |onnxruntime - torch| [N m] over ``windows``' inputs."""
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=['CPUExecutionProvider'])
    x = windows.inputs.reshape(-1, windows.inputs.shape[2])
    got = session.run(None, {ACTUATOR_NET_INPUT: x})[0]
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    return float(np.max(np.abs(got - want)))


# ---------------------------------------------------------------------------------- the fit
def joint_groups(robot: RobotSpec) -> dict[str, np.ndarray]:
    """{group: [J] bool}: the joint groups of the robot (hip, thigh, calf; others alone)."""
    return dict(joint_sets(robot, 'per_group'))


def fit_actuator_net(windows: HistoryWindows, robot: RobotSpec, cfg: ActuatorNetConfig,
                     source: str = '<recording>') -> tuple[ActuatorMlp, ActuatorNetReport]:
    """Train the network and the PD fit on ``windows`` and score both on the held-out part."""
    if windows.q.shape[2] != cfg.history:
        raise ValueError(f'windows of {windows.q.shape[2]} steps for a history of '
                         f'{cfg.history}')
    groups = joint_groups(robot)
    train, stop, held = split(windows, cfg, source)
    start = time.perf_counter()
    net, epochs, best_epoch = train_net(train, stop, cfg)
    train_s = time.perf_counter() - start
    # The PD fit sees all the data the net trained and stopped on.
    fit_part = windows.part(slice(0, len(train.t) + len(stop.t)))
    fits = fit_pd(fit_part, groups)
    report = ActuatorNetReport(
        groups={g: [robot.joint_names[i] for i in np.flatnonzero(m)] for g, m in groups.items()},
        net_rms=rms_by_group(net_effort(net, held), held.effort, groups),
        pd_rms=rms_by_group(pd_effort(held, groups, fits, robot.effort_limit), held.effort,
                            groups),
        pd_fit=fits, samples={'train': len(train.t), 'stop': len(stop.t), 'held_out':
                              len(held.t)},
        epochs=epochs, best_epoch=best_epoch, train_s=train_s, history=cfg.history,
        physics_dt=robot.sim_dt)
    return net, report


def write_actuator_net(path: str | Path, net: ActuatorMlp, report: ActuatorNetReport,
                       check: HistoryWindows) -> Path:
    """Write the network as ONNX (atomically) after an onnxruntime vs torch parity check on
    ``check``'s inputs; the report rides in the metadata under ``claw_rl_actuator_fit``."""
    model = onnx_model(net, report.history, report.physics_dt)
    report.parity = parity(model, net, check)
    if not report.parity < PARITY_TOLERANCE:
        raise RuntimeError(f'onnxruntime and torch disagree by {report.parity:.3g} N m '
                           f'(tolerance {PARITY_TOLERANCE:g}); the network was not written')
    entry = model.metadata_props.add()
    entry.key, entry.value = FIT_KEY, json.dumps(report.to_dict())
    path = Path(path)
    atomic_write_bytes(path, model.SerializeToString())
    return path
