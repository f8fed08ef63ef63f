"""The learned actuator (core/sysid/actuator_net.py, ``claw-rl actuator-net``): a hidden
non-linear actuator (a DC motor's torque-speed line plus joint friction, which no PD law can
express) runs the excitation on a stand and is recorded at the 50 Hz control rate; the network
trained on the first 80 % beats the PD fit on the held-out rest, then drives the sim (the
``network`` actuator at the physics rate) closer to the hidden robot than the PD fit does.
Also: the rate rule's histories, the PD fit on a linear drive, the network's input order
against the runtime's, and the refusals by name."""

import contextlib
import copy
import dataclasses
import io
import json
import re

import numpy as np
import onnx
import pytest
import torch
import yaml

from claw_rl_ros.cli import main
from claw_rl_ros.core import paths
from claw_rl_ros.core.config import from_dict, load_yaml
from claw_rl_ros.core.control.excitation import ExcitationConfig
from claw_rl_ros.core.sim.actuator import make_actuator
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sysid import actuator_net as an, trace as trace_module
from claw_rl_ros.core.sysid.hidden_robot import simulate, write_recording

# The hidden drive: the claw's PD law at a DC motor's voltage limit (stall 2 N m, no load at
# 3 rad/s: the excitation's chirps reach 3 rad/s) with 0.3 N m of joint friction and a
# command delay of one physics step.
HIDDEN = {'model': 'dc_motor', 'saturation_torque': 2.0, 'no_load_speed': 3.0,
          'delay_steps': [0, 0]}
FRICTION = {'hip': 0.3, 'thigh': 0.3, 'calf': 0.3}
DELAY = 1


def robot_yaml(path, actuator, **fields):
    """A copy of the claw's robot YAML at ``path`` (model_file absolute) with ``actuator`` and
    further robot ``fields``; returns its RobotSpec."""
    raw = load_yaml(paths.config_path('robots/claw_quadruped.yaml'))
    r = raw['robot']
    r['model_file'] = str(paths.share_dir() / r['model_file'])
    r['actuator'] = actuator
    r['joint_frictionloss'] = FRICTION
    r.update(fields)
    path.write_text(yaml.safe_dump(raw))
    return load_robot(path)


def run_cli(*argv):
    """(status, stdout, stderr) of ``claw-rl`` in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope='module')
def hidden(tmp_path_factory):
    """The hidden robot's recording and ``claw-rl actuator-net`` run on it (one torch
    thread: the same numbers on any machine; the process's setting restored after)."""
    threads = torch.get_num_threads()
    d = tmp_path_factory.mktemp('actuator_net')
    robot = robot_yaml(d / 'hidden.yaml', HIDDEN)
    trace = simulate(robot, DELAY, stand=True)
    mcap = write_recording(trace, d / 'hidden.mcap', robot)
    net = d / 'net.onnx'
    code, out, err = run_cli('actuator-net', mcap, '--robot', d / 'hidden.yaml', '--out', net,
                             '--epochs', 100, '--threads', 1)
    torch.set_num_threads(threads)
    assert code == 0, err
    meta = {p.key: p.value for p in onnx.load(str(net)).metadata_props}
    return dict(dir=d, robot=robot, trace=trace, mcap=mcap, net=net, out=out,
                report=json.loads(meta[an.FIT_KEY]))


# ------------------------------------------------------------------------ the demanded test
def test_the_net_beats_the_pd_fit_on_a_hidden_nonlinear_actuator(hidden):
    report, out = hidden['report'], hidden['out']
    # The torque-speed line bites: a good share of the efforts sit on it.
    trace = hidden['trace']
    c = HIDDEN['saturation_torque'] / HIDDEN['no_load_speed']
    on_line = np.abs(trace.effort) > HIDDEN['saturation_torque'] \
        - c * np.sign(trace.effort) * trace.qd - 1e-6
    assert on_line.mean() > 0.05
    for group in ('hip', 'thigh', 'calf', 'all'):
        assert report['net_rms'][group] < report['pd_rms'][group], group
    assert report['net_rms']['all'] < 0.5 * report['pd_rms']['all']
    assert report['samples']['held_out'] >= 0.19 * sum(report['samples'].values())
    # The printed table is the report's.
    line = next(ln for ln in out.splitlines() if ln.split()[:1] == ['all'])
    assert [float(x) for x in line.split()[1:]] == pytest.approx(
        [report['net_rms']['all'], report['pd_rms']['all']], abs=1e-3)
    assert 'held-out RMS effort error' in out and f'wrote {hidden["net"]}' in out


def test_the_network_drives_the_sim_like_the_hidden_robot(hidden):
    """The net as the robot's actuator (model network) replays the excitation at the physics
    rate closer to the hidden robot than the PD fit's gains (ideal_pd) do; then a training env
    steps with it."""
    d, trace = hidden['dir'], hidden['trace']
    net_robot = robot_yaml(d / 'net.yaml', {'model': 'network', 'network_file':
                                            str(hidden['net']), 'delay_steps': [0, 0]})
    fits = hidden['report']['pd_fit']
    pd_robot = robot_yaml(d / 'pd.yaml', {'model': 'ideal_pd', 'delay_steps': [0, 0]},
                          stiffness={g: f['kp'] for g, f in fits.items()},
                          damping={g: f['kd'] for g, f in fits.items()})
    by_net = simulate(net_robot, 0, stand=True)
    by_pd = simulate(pd_robot, max(f['delay_steps'] for f in fits.values()), stand=True)
    assert np.isfinite(by_net.q).all() and np.isfinite(by_net.effort).all()
    assert (np.abs(by_net.effort) <= net_robot.effort_limit + 1e-9).all()

    def rms(x):
        return float(np.sqrt(np.mean((x.q - trace.q) ** 2)))
    assert rms(by_net) < 0.02
    assert rms(by_net) < 0.6 * rms(by_pd)
    # A training env with the network actuator: N worlds, randomisation, observations.
    env = VecLocomotionEnv(from_dict(EnvConfig, {'num_envs': 3, 'seed': 0}), net_robot)
    env.reset(seed=0)
    for _ in range(10):
        obs = env.step(np.zeros((3, 12)))[0]
    lo, hi = env.physics.sensors.joint_torque
    torque = env.physics.sensordata[:, :, lo:hi]
    assert np.isfinite(obs['policy']).all() and np.isfinite(torque).all()
    assert (np.abs(torque) <= net_robot.effort_limit + 1e-9).all()
    env.close()


# -------------------------------------------------------------------------------- the parts
def test_physics_rate_data_gives_its_own_samples_back():
    rng = np.random.default_rng(0)
    dt, n, h, lag = 0.005, 60, 4, 1
    t = 3.0 + dt * np.arange(n)
    q, qd, effort, target = (rng.normal(size=(n, 2)) for _ in range(4))
    w = an.history_windows(t, q, qd, effort, t, target, dt, h, effort_lag=lag)
    first = lag + h - 1
    np.testing.assert_array_equal(w.t, t[first:])
    np.testing.assert_array_equal(w.effort, effort[first:])
    for i in range(h):
        # History sample i of sample k is the recording's sample k - lag - i.
        rows = slice(first - lag - i, n - lag - i)
        np.testing.assert_allclose(w.q[:, :, i], q[rows], atol=1e-9)
        np.testing.assert_allclose(w.qd[:, :, i], qd[rows], atol=1e-9)
        np.testing.assert_array_equal(w.target[:, :, i], target[rows])
    np.testing.assert_allclose(w.inputs[..., :h], (w.target - w.q).astype(np.float32))


def test_a_50_hz_recording_gives_physics_rate_histories():
    """Positions by cubic Hermite (their velocities as slopes), commands held from their own
    times: a 3 Hz sine at 50 Hz comes back at 200 Hz within 1e-3 of its amplitude."""
    dt, h = 0.005, 8
    t = 0.02 * np.arange(100)
    w0 = 2 * np.pi * 3.0
    q = 0.2 * np.sin(w0 * t)[:, None]
    qd = 0.2 * w0 * np.cos(w0 * t)[:, None]
    command_t = t + 0.001
    command = np.arange(100.0)[:, None]
    w = an.history_windows(t, q, qd, np.zeros_like(q), command_t, command, dt, h, effort_lag=0)
    at = w.t[:, None] - dt * np.arange(h)[None]
    np.testing.assert_allclose(w.q[:, 0], 0.2 * np.sin(w0 * at), atol=2e-4)
    np.testing.assert_allclose(w.qd[:, 0], 0.2 * w0 * np.cos(w0 * at), atol=0.01 * 0.2 * w0)
    # The command in force: the last one given at or before each history time.
    want = np.searchsorted(command_t, at, side='right') - 1
    np.testing.assert_array_equal(w.target[:, 0], want)
    assert w.t[0] >= command_t[0] + (h - 1) * dt


@pytest.mark.parametrize('decimation', [1, 4])
def test_the_pd_fit_recovers_a_linear_drive(tmp_path, decimation):
    """On an ideal PD drive (5 physics steps of delay) the baseline is a real fit: from joint
    states and efforts at the physics rate (decimation 1) Kp, Kd and the delay exactly; at the
    50 Hz control rate the histories between samples are interpolated, so the gains within
    15 % (the calves ring at ~10 Hz on a stand) and the delay within the control period the
    efforts, sampled at its last physics step, can tell apart."""
    gains = {'hip': (24.0, 0.6), 'thigh': (30.0, 0.75), 'calf': (36.0, 1.2)}
    robot = robot_yaml(tmp_path / 'pd.yaml', {'model': 'ideal_pd', 'delay_steps': [0, 0]},
                       stiffness={g: kp for g, (kp, _) in gains.items()},
                       damping={g: kd for g, (_, kd) in gains.items()}, decimation=decimation)
    trace = simulate(robot, 5, stand=True,
                     excitation=ExcitationConfig(chirp_s=3.0, step_hold_s=0.3))
    w = an.trace_windows(trace, robot, an.ActuatorNetConfig())
    groups = an.joint_groups(robot)
    fits = an.fit_pd(w, groups)
    rel, delays = (1e-6, [5]) if decimation == 1 else (0.15, [4, 5, 6, 7])
    for group, (kp, kd) in gains.items():
        assert fits[group].kp == pytest.approx(kp, rel=rel), group
        assert fits[group].kd == pytest.approx(kd, rel=rel), group
        assert fits[group].delay_steps in delays, group
    effort = an.pd_effort(w, groups, fits, robot.effort_limit)
    assert an.rms_by_group(effort, w.effort, groups)['all'] < (1e-6 if decimation == 1 else 0.1)


def test_the_network_reads_its_history_as_the_runtime_feeds_it(hidden):
    """The written file, run by the sim's LearnedActuator one physics step at a time, gives
    the torques the trained network gives on the training windows (newest first)."""
    robot = dataclasses.replace(hidden['robot'], actuator=dataclasses.replace(
        hidden['robot'].actuator, model='network', network_path=hidden['net']))
    act = make_actuator(robot, 1)
    cfg = an.ActuatorNetConfig()
    w = an.trace_windows(hidden['trace'], robot, cfg).part(slice(200, 203))
    session_out = []
    for s in range(3):
        act.window[:] = 0.0
        error, qd = w.target[s] - w.q[s], w.qd[s]
        for i in reversed(range(cfg.history)):
            tau = act.torque(error[None, :, i], qd[None, :, i], None, None)
        session_out.append(tau[0])
    # The same windows through onnxruntime directly, in the training input layout.
    direct = act.session.run(None, {'history': w.inputs.reshape(-1, 2 * cfg.history)})[0]
    np.testing.assert_allclose(np.array(session_out), direct.reshape(3, 12), atol=1e-6)
    assert np.abs(np.array(session_out)).max() > 0.05


# ----------------------------------------------------------------------------- the refusals
@pytest.mark.parametrize('bad, message', [
    ('no_effort', r'joint_states\.effort: the recording carries no effort'),
    ('nan_effort', r'joint_states\.effort: FL_thigh_joint is nan'),
    ('joint_names', r"joints \['FL_hip', .*are not joints of robot"),
    ('short', r'recording: too short: 2\.\d+ s of excitation'),
])
def test_bad_recordings_are_refused_by_name(hidden, tmp_path, monkeypatch, bad, message):
    trace, robot = copy.deepcopy(hidden['trace']), hidden['robot']
    if bad == 'no_effort':
        # A driver without effort: its recording reads as a trace without (write_recording
        # writes efforts, so the reader is handed that trace).
        monkeypatch.setattr(trace_module, 'load_trace',
                            lambda path, robot: dataclasses.replace(
                                trace.without_effort(), source=str(path)))
    elif bad == 'nan_effort':
        trace.effort[300, 1] = np.nan
    elif bad == 'joint_names':
        trace.joints = [n.replace('_joint', '') for n in trace.joints]
    elif bad == 'short':
        keep = slice(0, 150)
        trace = dataclasses.replace(trace, t=trace.t[keep], q=trace.q[keep],
                                    qd=trace.qd[keep], effort=trace.effort[keep],
                                    target=trace.target[keep], window=(10, 150))
    mcap = write_recording(trace, tmp_path / 'bad.mcap', robot)
    out_file = tmp_path / 'net.onnx'
    code, out, err = run_cli('actuator-net', mcap, '--robot', hidden['dir'] / 'hidden.yaml',
                             '--out', out_file, '--epochs', 1)
    assert code == 2 and err.count('\n') == 1 and 'Traceback' not in err
    assert err.startswith('claw-rl: error: ')
    assert re.search(message, err), err
    assert not out_file.exists()


def test_bad_options_are_refused_by_name(hidden, tmp_path):
    for argv, message in ((['--history', 0], '--history: 0'), (['--epochs', -1], '--epochs'),
                          (['--threads', -2], '--threads: -2')):
        code, _, err = run_cli('actuator-net', hidden['mcap'], '--robot',
                               hidden['dir'] / 'hidden.yaml', '--out', tmp_path / 'n.onnx',
                               *argv)
        assert code == 2 and message in err, err
