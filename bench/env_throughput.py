"""Batched env throughput vs the physical limit, measured side by side in one run.

physical limit [env steps/s] = raw mj_step rate (one core, same model, states from the env's own
random-action rollouts) x cores / decimation. The headline ratio at 256 worlds comes from
alternating rounds (raw rate, then env rate) and is the median of the per-round ratios; the
table for other sizes divides by the median raw rate. The env is the main job's: its worlds
share randomised model copies as config/train_ppo.yaml says (``worlds_per_model``). Also
reports the peak RSS of a 256-world batch, and flat vs terrain vs terrain + height scan at 256
worlds (config/train_rough.yaml's terrain and model copies, every world on level 0 as training
starts), measured in alternating rounds so machine load hits all three alike; the ratio is each
one's median rate over flat's.

``--warmstart``: the solver's warm start. The env's rollout calls pass no warm start, so every
control step's first physics step starts the constraint solver cold (mjSTATE_FULLPHYSICS holds
no qacc_warmstart, and MuJoCo 4.0's rollout returns no warm start). Carried instead as the last
physics step's acceleration, recovered from the last two output states ((qvel[-1] - qvel[-2]) /
dt, passed as ``initial_warmstart``): rollout steps/s cold vs warm on the same 256 worlds and
controls (alternating repetitions), and on 32 of those states one control step with the env's
4 solver iterations against a converged solve (200 iterations): iterations used per physics
step, the largest joint-velocity error, and mean deepest penetration.

``--profile``: where an env step's time goes at 256 worlds (flat and terrain + scan): each
part's inclusive wall time per control step and share of the step, from timers wrapped around
the env's own methods (the rollout call, step data, rewards, resets with their randomisation
and sensor refresh, observations, command resampling, pushes), and the rest (action clipping,
bookkeeping, the wrappers' own cost).

``--visuals``: env steps/s at 256 worlds with every world's model holding the robot's visual
geoms and the floor's texture (as before 2026-12-05) and without them (the default), in
alternating rounds.

``--shared-models``: env steps/s at 256 worlds with every world its own randomised model copy
(``env.randomization.worlds_per_model`` 1) and with 4, 8 and 16 worlds per copy
(core/sim/model_variants.py), flat and terrain + scan, alternating rounds, each over 1's median.

``--collision``: env steps/s at 256 worlds on flat, on the heightfield terrain and on box
ground (``env.terrain.collision: boxes``, core/sim/ground.py), scan on, alternating rounds, each
over flat's median; with the env's defaults, then with the terrain job's noslip pass.

``--actuators``: env steps/s at 256 worlds (the main job's env, flat) with the ideal PD actuator
and today's randomisation, then with the transfer randomisation (Kp and Kd apart, joint
friction, damping and armature per joint, delays up to 40 ms, contact softness, encoder
offsets, IMU bias and tilt, sensor delay, control jitter), and the same two with the
``dc_motor`` actuator (inside MuJoCo's step: a second actuator per joint), and the same two with
the learned ``network`` actuator (core/sim/actuator.py: the ONNX MLP between physics steps, one
rollout call per physics step; the bench trains a Hwangbo-sized network, history 8, 2 x 32
softsign, to the robot's PD law clipped at the effort limit, so the robot moves as under
ideal_pd), alternating rounds, each median over the ideal PD's.

``--chunks``: env steps/s at 256 worlds with the rollout's thread-pool task size (worlds per
task) at 2, 4, 8 (the default on 2 threads) and 32 (the earlier default), alternating rounds,
each over 32's median.

    .venv/bin/python bench/env_throughput.py [--sizes 1 16 64 256] [--seconds 3] [--rounds 3]
        [--warmstart] [--profile] [--chunks] [--actuators] [--visuals] [--noslip] [--shared-models]
        [--collision]
"""

import argparse
import dataclasses
import os
from pathlib import Path
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

import mujoco
import numpy as np
import torch

from claw_rl_ros.core.config import from_dict
from claw_rl_ros.core.learning.train_config import load_train_config
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.physics import STATE_SPEC
from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sim.robot_spec import RobotSpec
from claw_rl_ros.core.sysid.actuator_net import (ActuatorNetConfig, HistoryWindows,
                                                 onnx_model, train_net)


# The terrain settings of the side-by-side rows (train_rough.yaml's types and levels); the
# last two trade the heightfield's resolution (default cell 0.2 H, H the standing height) for
# speed: MuJoCo tests a claw against every triangular prism under it, and a finer grid puts
# more prism edges under each claw (more narrow-phase calls and contacts).
SCAN = {'enabled': True, 'height_scan': {'enabled': True}}
BOXES = {**SCAN, 'collision': 'boxes'}
TERRAIN = {'flat': {}, 'terrain': {'enabled': True}, 'terrain + scan': SCAN,
           'scan, cell 0.3 H': {**SCAN, 'horizontal_scale': 0.3},
           'scan, cell 0.4 H': {**SCAN, 'horizontal_scale': 0.4},
           'scan, box ground': BOXES}


# The env as the main job runs it (worlds sharing randomised model copies as its config says),
# and as the terrain job does.
MAIN_JOB_SHARE, TERRAIN_JOB_SHARE = (
    load_train_config(name).env.randomization.worlds_per_model
    for name in ('train_ppo.yaml', 'train_rough.yaml'))
TERRAIN_JOB_NOSLIP = load_train_config('train_rough.yaml').env.noslip_iterations


def make_env(num_envs: int, terrain: str = 'flat', **env: Any) -> VecLocomotionEnv:
    """``env``: further EnvConfig keys (e.g. ``noslip_iterations=3``); worlds share model
    copies as in the main job unless ``randomization`` says otherwise."""
    cfg = {'num_envs': num_envs, 'seed': 0,
           'randomization': {'worlds_per_model': MAIN_JOB_SHARE}, **env}
    if TERRAIN[terrain]:
        cfg['terrain'] = dict(TERRAIN[terrain])
        if 'horizontal_scale' in cfg['terrain']:
            # Given in standing heights here; the config takes metres.
            cfg['terrain']['horizontal_scale'] *= load_robot('claw_quadruped').standing_height
    return VecLocomotionEnv(from_dict(EnvConfig, cfg))


def raw_step_samples(num_envs: int = 16, steps: int = 100):
    """(model, states [K, nstate], ctrls [K, nu]) the env visits under random actions."""
    env = make_env(num_envs)
    rng = np.random.default_rng(0)
    states, ctrls = [], []
    for _ in range(steps):
        env.step(rng.normal(0, 1.0, (num_envs, env.num_actions)))
        states.append(env.physics.state.copy())
        ctrls.append(env.targets.copy())
    model = env.physics.model
    env.close()
    return model, np.concatenate(states), np.concatenate(ctrls)


def raw_mj_step_rate(seconds: float, samples=None) -> float:
    """mj_step/s on one thread from states the env visits under random actions."""
    model, states, ctrls = samples or raw_step_samples()
    data = mujoco.MjData(model)
    steps, busy, i = 0, 0.0, 0
    while busy < seconds:
        k = i % len(states)
        mujoco.mj_setState(model, data, states[k], STATE_SPEC)
        data.ctrl[:] = ctrls[k]
        start = time.perf_counter()
        mujoco.mj_step(model, data, nstep=4)
        busy += time.perf_counter() - start
        steps += 4
        i += 1
    return steps / busy


def alternating_rates(envs: dict, seconds: float, rounds: int) -> dict:
    """{key: [env steps/s per round]} of ``envs`` stepped in turn, ``rounds`` times (machine
    load hits them alike); closes them."""
    rates: dict = {key: [] for key in envs}
    for r in range(rounds):
        for key, env in envs.items():
            rates[key].append(stepped_rate(env, seconds, seed=r))
    for env in envs.values():
        env.close()
    return rates


def visual_geoms_ab(seconds: float, rounds: int) -> None:
    """``--visuals``: env steps/s at 256 worlds with and without the robot's visual geoms and
    the floor's texture in every world's model, alternating rounds in one process; each round's
    ratio and the median."""
    cfg = from_dict(EnvConfig, {'num_envs': 256, 'seed': 0})
    envs = {v: VecLocomotionEnv(cfg, visuals=v) for v in (True, False)}
    rates = alternating_rates(envs, seconds, rounds)
    ratios = np.array(rates[False]) / np.array(rates[True])
    print(f'256 worlds: with visual geoms ({envs[True].physics.model.ngeom} geoms) '
          + ', '.join(f'{x:,.0f}' for x in rates[True]) + f' /s; without '
          f'({envs[False].physics.model.ngeom}) ' + ', '.join(f'{x:,.0f}' for x in rates[False])
          + ' /s; ratio ' + ', '.join(f'{x:.3f}' for x in ratios)
          + f', median {np.median(ratios):.3f}')


def noslip_ab(seconds: float, rounds: int) -> None:
    """``--noslip``: env steps/s at 256 worlds with ``noslip_iterations`` 0 (the default) and 3
    (no creeping friction), flat and terrain + scan, alternating rounds in one process."""
    for floor in ('flat', 'terrain + scan'):
        envs = {k: make_env(256, floor, noslip_iterations=k) for k in (0, 3)}
        rates = alternating_rates(envs, seconds, rounds)
        ratios = np.array(rates[3]) / np.array(rates[0])
        print(f'{floor:>15}: noslip 0 ' + ', '.join(f'{x:,.0f}' for x in rates[0]) + ' /s; 3 '
              + ', '.join(f'{x:,.0f}' for x in rates[3]) + ' /s; ratio '
              + ', '.join(f'{x:.3f}' for x in ratios) + f', median {np.median(ratios):.3f}')


def shared_models_ab(seconds: float, rounds: int) -> None:
    """``--shared-models``: env steps/s at 256 worlds with every world its own randomised model
    copy (``randomization.worlds_per_model`` 1) and with 4, 8 and 16 worlds per copy, flat and
    terrain + scan, alternating rounds in one process; each median over 1's."""
    for floor in ('flat', 'terrain + scan'):
        envs = {k: make_env(256, floor, randomization={'worlds_per_model': k})
                for k in (1, 4, 8, 16)}
        copies = {k: len(env.physics.copies) for k, env in envs.items()}
        rates = alternating_rates(envs, seconds, rounds)
        base = float(np.median(rates[1]))
        print(f'{floor:>15}: ' + '; '.join(
            f'{k} per copy ({copies[k]} copies) ' + ', '.join(f'{x:,.0f}' for x in v)
            + f' /s, median {np.median(v) / base:.3f}x' for k, v in rates.items()))


# The transfer randomisation the --actuators bench adds to the main job's env.
TRANSFER_RANDOMIZATION = {'kp_scale': [0.7, 1.3], 'kd_scale': [0.7, 1.5],
                          'joint_friction_scale': [0.5, 5.0], 'joint_damping_scale': [0.5, 2.0],
                          'armature_scale': [0.3, 3.0], 'action_latency_substeps': [0, 8],
                          'contact_timeconst': [0.01, 0.05], 'encoder_offset': [-0.03, 0.03],
                          'imu_gyro_bias': [-0.05, 0.05], 'imu_tilt_offset': [-0.03, 0.03],
                          'joint_state_delay_substeps': [0, 1], 'control_jitter_substeps': 1}


def pd_like_network(robot: RobotSpec, path: str, history: int = 8) -> str:
    """Train a learned actuator (the default network size) on random histories labelled with
    the robot's PD law clipped at the effort limit, write it as ONNX to ``path``; returns it."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n, j = 4096, robot.num_joints
    target = rng.normal(0, 0.2, (n, j, history))
    q = rng.normal(0, 0.2, (n, j, history))
    qd = rng.normal(0, 3.0, (n, j, history))
    # tau = clip(Kp (target - q) - Kd qd) at the newest sample.
    tau = np.clip(robot.kp * (target[..., 0] - q[..., 0]) - robot.kd * qd[..., 0],
                  -robot.effort_limit, robot.effort_limit)
    windows = HistoryWindows(np.arange(n) * robot.sim_dt, target, q, qd, tau)
    cfg = ActuatorNetConfig(history=history, epochs=20, batch_size=1024)
    net, _, _ = train_net(windows, windows.part(slice(0, 512)), cfg)
    with open(path, 'wb') as f:
        f.write(onnx_model(net, history, robot.sim_dt).SerializeToString())
    return path


def actuators_ab(seconds: float, rounds: int) -> None:
    """``--actuators``: env steps/s at 256 worlds with ideal_pd, dc_motor and the learned
    network, each with and without the transfer randomisation, alternating rounds in one
    process; each median over ideal_pd's."""
    robot = load_robot('claw_quadruped')
    dc = dataclasses.replace(robot, actuator=dataclasses.replace(robot.actuator,
                                                                 model='dc_motor'))
    net_file = pd_like_network(robot, os.path.join(tempfile.mkdtemp(), 'actuator_net.onnx'))
    net = dataclasses.replace(robot, actuator=dataclasses.replace(
        robot.actuator, model='network', network_path=Path(net_file)))
    base = {'num_envs': 256, 'seed': 0, 'randomization': {'worlds_per_model': MAIN_JOB_SHARE}}
    wide = {**base, 'randomization': {**base['randomization'], **TRANSFER_RANDOMIZATION}}
    envs = {'ideal_pd': VecLocomotionEnv(from_dict(EnvConfig, base), robot),
            'ideal_pd + transfer randomisation': VecLocomotionEnv(from_dict(EnvConfig, wide),
                                                                  robot),
            'dc_motor': VecLocomotionEnv(from_dict(EnvConfig, base), dc),
            'dc_motor + transfer randomisation': VecLocomotionEnv(from_dict(EnvConfig, wide), dc),
            'network': VecLocomotionEnv(from_dict(EnvConfig, base), net),
            'network + transfer randomisation': VecLocomotionEnv(from_dict(EnvConfig, wide),
                                                                 net)}
    # The network's own time: its torque calls in the plain network env, timed.
    actuator, spent = envs['network'].physics.actuator, {'s': 0.0, 'calls': 0}
    inner = actuator.torque

    def timed(*args):
        start = time.perf_counter()
        try:
            return inner(*args)
        finally:
            spent['s'] += time.perf_counter() - start
            spent['calls'] += 1
    actuator.torque = timed
    rates = alternating_rates(envs, seconds, rounds)
    ref = np.array(rates['ideal_pd'])
    for key, v in rates.items():
        # Each round's ratio to that round's ideal_pd (the same machine load), and its median.
        ratios = np.array(v) / ref
        print(f'{key:>34}: ' + ', '.join(f'{x:,.0f}' for x in v)
              + f' /s, median {np.median(v):,.0f} /s; per round x ideal_pd '
              + ', '.join(f'{x:.3f}' for x in ratios) + f', median {np.median(ratios):.3f}')
    steps = spent['calls'] / robot.decimation
    net_ms = 1000 * spent['s'] / steps
    step_ms = 1000 * 256 / float(np.median(rates['network']))
    print(f'the actuator network ({robot.decimation} onnxruntime calls of 256 x '
          f'{robot.num_joints} histories per env step): {net_ms:.2f} ms of a {step_ms:.2f} ms '
          f'256-world env step ({net_ms / step_ms:.0%}; {1000 * net_ms / 256:.1f} us per world)')


def limit_rounds(num_envs: int, seconds: float, rounds: int) -> tuple[list[float], list[float]]:
    """([raw mj_step/s], [env steps/s]) of ``rounds`` alternating rounds: one core's raw rate,
    then the batched env's, so machine load hits the limit and the env alike."""
    samples = raw_step_samples()
    env = make_env(num_envs)
    raws, rates = [], []
    for r in range(rounds):
        raws.append(raw_mj_step_rate(seconds, samples))
        rates.append(stepped_rate(env, seconds, seed=r))
    env.close()
    return raws, rates


def stepped_rate(env: VecLocomotionEnv, seconds: float, seed: int = 1) -> float:
    """env steps/s of random actions on an env that is already built (after 10 warm-up steps)."""
    rng = np.random.default_rng(seed)
    actions = [rng.normal(0, 1.0, (env.num_envs, env.num_actions)) for _ in range(64)]
    for a in actions[:10]:
        env.step(a)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps % 64])
        steps += 1
    return steps * env.num_envs / (time.perf_counter() - start)


def env_rate(num_envs: int, seconds: float) -> float:
    env = make_env(num_envs)
    rate = stepped_rate(env, seconds)
    env.close()
    return rate


def terrain_rates(num_envs: int, seconds: float, rounds: int) -> dict[str, float]:
    """{setting: median env steps/s over alternating rounds} for each TERRAIN setting, every
    world its own model copy as the terrain job runs (config/train_rough.yaml)."""
    rates = alternating_rates({name: make_env(num_envs, name, randomization={
        'worlds_per_model': TERRAIN_JOB_SHARE}) for name in TERRAIN}, seconds, rounds)
    return {name: float(np.median(v)) for name, v in rates.items()}


def collision_ab(seconds: float, rounds: int) -> None:
    """Flat vs terrain + scan on the heightfield vs on box ground (env.terrain.collision),
    256 worlds, alternating rounds; each median over flat's. Twice: with the env's defaults
    (as the other rows), then with the terrain job's noslip pass (config/train_rough.yaml)."""
    share = {'worlds_per_model': TERRAIN_JOB_SHARE}
    for noslip in (0, TERRAIN_JOB_NOSLIP):
        print(f'noslip_iterations {noslip}:')
        rates = alternating_rates({name: make_env(256, name, randomization=share,
                                                  noslip_iterations=noslip)
                                   for name in ('flat', 'terrain + scan', 'scan, box ground')},
                                  seconds, rounds)
        flat = float(np.median(rates['flat']))
        for name, values in rates.items():
            print(f'{name:>17}: ' + ', '.join(f'{v:,.0f}' for v in values)
                  + f' /s, median {np.median(values):,.0f} '
                  f'({np.median(values) / flat:.1%} of flat)')
    print('(goal: terrain + scan >= 70 % of flat)')


def warmstart_comparison(floor: str, calls: int = 200, num_envs: int = 256,
                         reps: int = 3) -> dict[str, float]:
    """Cold vs carried solver warm start on the env's worlds (module docstring)."""
    from mujoco import rollout
    env = make_env(num_envs, floor)
    rng = np.random.default_rng(0)
    for _ in range(30):
        env.step(rng.normal(0, 1.0, (num_envs, env.num_actions)))
    p = env.physics
    state0, dec, model, qv = p.state.copy(), p.decimation, p.model, p.qvel_slice
    ctrls = [np.repeat(env.robot.action_to_target(
        rng.normal(0, 1.0, (num_envs, env.num_actions)))[:, None], dec, 1) for _ in range(calls)]
    rates: dict[str, list[float]] = {'cold': [], 'warm': []}
    for mode in ('cold', 'warm') * reps:
        state, warm = state0.copy(), None
        runner = rollout.Rollout(nthread=p.num_threads)
        datas = [mujoco.MjData(model) for _ in range(max(1, p.num_threads))]
        out = np.zeros((num_envs, dec, p.nstate))
        start = time.perf_counter()
        for ctrl in ctrls:
            runner.rollout(p.models, datas, state, ctrl, skip_checks=True, nstep=dec,
                           control_spec=int(mujoco.mjtState.mjSTATE_CTRL), state=out,
                           initial_warmstart=warm, chunk_size=p._chunk)
            state = out[:, -1].copy()
            if mode == 'warm':
                # The last step's acceleration: what mj_step leaves in qacc_warmstart.
                warm = (out[:, -1, qv] - out[:, -2, qv]) / model.opt.timestep
        rates[mode].append(calls * num_envs / (time.perf_counter() - start))
    quality = {k: {'iterations': [], 'error': [], 'penetration': []} for k in rates}
    data = mujoco.MjData(model)
    for i in range(32):
        m = p.models[i]
        mujoco.mj_setState(m, data, state0[i], STATE_SPEC)
        data.ctrl[:] = ctrls[0][i, 0]
        mujoco.mj_forward(m, data)
        previous = data.qacc.copy()

        def control_step(iterations, warmstart):
            saved = m.opt.iterations, m.opt.tolerance
            m.opt.iterations = iterations
            if iterations > 50:
                m.opt.tolerance = 1e-12
            mujoco.mj_setState(m, data, state0[i], STATE_SPEC)
            data.qacc_warmstart[:] = warmstart
            data.ctrl[:] = ctrls[0][i, 0]
            used, deepest = [], []
            for _ in range(dec):
                mujoco.mj_step(m, data)
                used.append(data.solver_niter[0])
                deepest.append(max([-c.dist for c in data.contact[:data.ncon]] + [0.0]))
            m.opt.iterations, m.opt.tolerance = saved
            return data.qvel.copy(), np.mean(used), np.mean(deepest)
        converged = control_step(200, previous)[0]
        for mode, start_acc in (('cold', np.zeros(model.nv)), ('warm', previous)):
            qvel, used, deepest = control_step(model.opt.iterations, start_acc)
            quality[mode]['iterations'].append(used)
            quality[mode]['error'].append(np.abs(qvel - converged).max())
            quality[mode]['penetration'].append(deepest)
    env.close()
    out = {}
    for mode in rates:
        out[f'{mode}_rate'] = float(np.median(rates[mode]))
        out[f'{mode}_iterations'] = float(np.mean(quality[mode]['iterations']))
        out[f'{mode}_error'] = float(np.median(quality[mode]['error']))
        out[f'{mode}_penetration_mm'] = 1000 * float(np.mean(quality[mode]['penetration']))
    return out


def step_profile(floor: str, seconds: float, num_envs: int = 256) -> dict[str, float]:
    """{part: ms per control step} of ``num_envs`` worlds under random actions, and 'step'."""
    env = make_env(num_envs, floor)
    spent: dict[str, float] = {}

    def timed(owner, name, label):
        inner = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - start
        setattr(owner, name, wrapper)
    parts = [(env.physics, 'step', 'rollout call (physics)'),
             (env, '_step_data', 'step data (contacts, velocities)'),
             (env.reward_manager, 'compute', 'rewards'),
             (env, '_reset_worlds', 'resets (randomisation, sensor refresh)'),
             (env, '_observe', 'observations'),
             (env, '_resample_commands', 'command resampling'),
             (env, '_push', 'pushes')]
    for owner, name, label in parts:
        timed(owner, name, label)
    rng = np.random.default_rng(0)
    actions = [rng.normal(0, 1.0, (num_envs, env.num_actions)) for _ in range(64)]
    for a in actions[:10]:
        env.step(a)
    spent.clear()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps % 64])
        steps += 1
    total = time.perf_counter() - start
    env.close()
    out = {label: 1000 * spent.get(label, 0.0) / steps for _, _, label in parts}
    out['rest'] = 1000 * total / steps - sum(out.values())
    out['step'] = 1000 * total / steps
    return out


def peak_rss_mib(num_envs: int, terrain: str = 'flat', share: int | None = None) -> float:
    """Peak RSS of a fresh process that builds and steps a num_envs batch (``share`` worlds
    per model copy; None: the main job's).

    Read from the child's own VmHWM: Linux carries ru_maxrss over fork and exec, so a child's
    getrusage would report this (bigger) process's peak instead.
    """
    code = ('import numpy as np, sys; sys.path.insert(0, "bench"); '
            'from env_throughput import make_env; '
            f'env = make_env({num_envs}, {terrain!r}, randomization={{"worlds_per_model": '
            f'{share or MAIN_JOB_SHARE}}}); '
            '[env.step(np.zeros((env.num_envs, env.num_actions))) for _ in range(200)]; '
            'print([line.split()[1] for line in open("/proc/self/status") '
            'if line.startswith("VmHWM:")][0])')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__)) or '.')
    return int(out.stdout.strip().splitlines()[-1]) / 1024.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--sizes', type=int, nargs='+', default=[1, 16, 64, 256])
    parser.add_argument('--seconds', type=float, default=3.0)
    parser.add_argument('--rounds', type=int, default=3, help='alternating rounds of raw vs '
                        'env and of the flat / terrain / terrain + scan rows')
    parser.add_argument('--warmstart', action='store_true', help='only the cold vs carried '
                        'solver warm start comparison')
    parser.add_argument('--profile', action='store_true', help='only where a step\'s time '
                        'goes at 256 worlds')
    parser.add_argument('--chunks', action='store_true', help='only the rollout task sizes')
    parser.add_argument('--actuators', action='store_true', help='only 256 worlds with the '
                        'ideal PD actuator, dc_motor and the learned network, each with and '
                        'without the transfer randomisation')
    parser.add_argument('--visuals', action='store_true', help='only 256 worlds with and '
                        'without the robot\'s visual geoms')
    parser.add_argument('--noslip', action='store_true', help='only 256 worlds with MuJoCo\'s '
                        'noslip pass off and on (env.noslip_iterations 0 vs 3)')
    parser.add_argument('--shared-models', action='store_true', help='only 256 worlds with '
                        '1, 4, 8 and 16 worlds per randomised model copy')
    parser.add_argument('--collision', action='store_true', help='only 256 worlds on flat, '
                        'on the heightfield terrain and on box ground (scan on)')
    args = parser.parse_args()
    if args.actuators:
        actuators_ab(args.seconds, args.rounds)
        return
    if args.collision:
        collision_ab(args.seconds, args.rounds)
        return
    if args.shared_models:
        shared_models_ab(args.seconds, args.rounds)
        return
    if args.noslip:
        noslip_ab(args.seconds, args.rounds)
        return
    if args.visuals:
        visual_geoms_ab(args.seconds, args.rounds)
        return
    if args.chunks:
        for floor in ('flat', 'terrain + scan'):
            env = make_env(256, floor)
            rates: dict[int, list[float]] = {2: [], 4: [], 8: [], 32: []}
            for r in range(args.rounds):
                for chunk in rates:
                    env.physics._chunk = chunk
                    rates[chunk].append(stepped_rate(env, args.seconds, seed=r))
            env.close()
            base = float(np.median(rates[32]))
            print(f'{floor:>15}: ' + ', '.join(
                f'{chunk} worlds/task {np.median(v):,.0f} /s ({np.median(v) / base:.3f})'
                for chunk, v in rates.items()))
        return
    if args.profile:
        for floor in ('flat', 'terrain + scan'):
            prof = step_profile(floor, args.seconds)
            step = prof.pop('step')
            print(f'{floor} at 256 worlds: {step:.2f} ms per control step '
                  f'({256 / step * 1000:,.0f} env steps/s)')
            for label, ms in prof.items():
                print(f'  {label:>40} {ms:7.3f} ms {ms / step:6.1%}')
        return
    if args.warmstart:
        print(f'{"floor":>8} {"cold /s":>8} {"warm /s":>8} {"ratio":>6} | solver iterations '
              'cold / warm | max |qvel - converged| cold / warm | penetration cold / warm')
        for floor in ('flat', 'terrain'):
            r = warmstart_comparison(floor)
            print(f'{floor:>8} {r["cold_rate"]:8,.0f} {r["warm_rate"]:8,.0f} '
                  f'{r["warm_rate"] / r["cold_rate"]:6.3f} | {r["cold_iterations"]:.2f} / '
                  f'{r["warm_iterations"]:.2f} | {r["cold_error"]:.1e} / {r["warm_error"]:.1e} '
                  f'm/s | {r["cold_penetration_mm"]:.2f} / {r["warm_penetration_mm"]:.2f} mm')
        return
    cores = os.cpu_count() or 1
    raws, rates = limit_rounds(256, args.seconds, args.rounds)
    ratios = [rate / (raw * cores / 4) for raw, rate in zip(raws, rates)]
    raw = float(np.median(raws))
    limit = raw * cores / 4
    print(f'raw mj_step: {raw:,.0f} steps/s on one core (median); {cores} cores, decimation 4 '
          f'-> physical limit {limit:,.0f} env steps/s')
    print(f'256 worlds, {args.rounds} alternating rounds (raw, env): env '
          + ', '.join(f'{r:,.0f}' for r in rates) + ' /s = '
          + ', '.join(f'{x:.1%}' for x in ratios)
          + f' of that round\'s limit; median {np.median(ratios):.1%} (goal >= 80 %)')
    print(f'{"worlds":>7} {"env steps/s":>12} {"of limit":>9}')
    for n in args.sizes:
        rate = env_rate(n, args.seconds)
        print(f'{n:>7} {rate:>12,.0f} {rate / limit:>9.1%}')
    rss = peak_rss_mib(256)
    print(f'peak RSS of a 256-world batch: {rss:,.0f} MiB (goal < 1024 MiB)')
    print(f'\nterrain at 256 worlds ({args.rounds} alternating rounds of {args.seconds:g} s, '
          'median):')
    print(f'{"floor":>17} {"env steps/s":>12} {"of flat":>8} {"peak RSS":>9}')
    rates = terrain_rates(256, args.seconds, args.rounds)
    for name, rate in rates.items():
        print(f'{name:>17} {rate:>12,.0f} {rate / rates["flat"]:>8.1%} '
              f'{peak_rss_mib(256, name, TERRAIN_JOB_SHARE):>6,.0f} MiB')
    print('(goal: terrain + scan >= 70 % of flat; the default is cell 0.2 H)')
    print(f'(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB)')


if __name__ == '__main__':
    main()
