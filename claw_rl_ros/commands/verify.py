"""``claw-rl verify --model student.onnx``: the sim2sim gate through the real ROS path.

Starts the package's ``control`` graph (sim_node + policy_node as processes, through the same
graph runner as ``claw-rl up``) in lockstep, with the sim node's perturbations from
``config/verify.yaml``, drives N episodes at a fixed forward command, prints the pass/fail table
(:mod:`claw_rl_ros.core.deploy.verify`), writes ``<model stem>.verify.json`` beside the model and
exits 0 (pass) or 1 (fail); 2 for a usage error (missing or unusable model, bad config).

Why lockstep: the sim waits for each command, so the verdict does not depend on how loaded the
machine is (realtime on a busy machine adds random missed ticks that no robot has) and it runs
as fast as the loop allows; the ROS path (DDS, messages, the policy node's code and its model)
is the deployed one. Action latency (0-20 ms) is simulated in sim time: the sim delays each
command by a drawn number of physics substeps. The policy node's own wall-clock latency is
measured all the same and is a row of the table.

The graph runs in its own DDS domain (random ``ROS_DOMAIN_ID``, localhost discovery) unless
``--domain-id`` is given, so a verification never talks to a robot on the network.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
from pathlib import Path
import random
import threading
import time

from ..core.config import ConfigError


def _load_model(model: str, robot_name: str):
    """(RobotSpec, sha256) of a model that can drive the robot; ConfigError otherwise."""
    from ..core.deploy.onnx_policy import ModelError, OnnxPolicy
    from ..core.sim.robot import load_robot
    try:
        policy = OnnxPolicy(model)
        robot = load_robot(robot_name or policy.spec.get('robot', ''))
        policy.check_robot(robot)
    except ModelError as exc:
        raise ConfigError('--model', '', str(exc)) from None
    return robot, policy.sha256


def _config(args: argparse.Namespace):
    """(VerifyConfig with the command-line overrides, absolute path of the YAML)."""
    from ..core import paths
    from ..core.config import load_config, merge, to_dict, from_dict
    from ..core.deploy.verify import VerifyConfig
    from ..core.sim.env_config import EnvConfig
    path = paths.config_path(args.config).resolve()
    load_config(EnvConfig, path, 'env')  # the sim node would refuse it: refuse it here first
    cfg = load_config(VerifyConfig, path, 'verify')
    overrides = {k: v for k, v in (('episodes', args.episodes), ('episode_s', args.seconds))
                 if v is not None}
    return from_dict(VerifyConfig, merge(to_dict(cfg), overrides), source='claw-rl verify'), path


def _nodes(model: str, robot_name: str, env_config: Path, seed: int):
    """The control graph in lockstep, its sim node perturbed as config/verify.yaml says."""
    from ..launch_graph import GRAPHS, resolve
    nodes = resolve(GRAPHS['control'], {'model': model, 'robot': robot_name,
                                        'mode': 'lockstep', 'use_sim_time': 'true'})
    sim = {'randomization': True, 'pushes': True, 'noise': True, 'env_config': str(env_config),
           'seed': seed, 'reset_on_fall': True, 'command_timeout_s': 0.2}
    return [dataclasses.replace(n, parameters={**n.parameters, **sim})
            if n.executable == 'sim_node' else n for n in nodes]


def _ros_env(domain_id: int | None) -> dict[str, str]:
    env = {'ROS_DOMAIN_ID': str(domain_id if domain_id is not None else
                                random.SystemRandom().randint(1, 100)),
           'ROS_AUTOMATIC_DISCOVERY_RANGE': 'LOCALHOST'}
    os.environ.update(env)  # the driver node in this process joins the same domain
    return {**os.environ, **env}


def run_verify(args: argparse.Namespace) -> int:
    from ..core.deploy import verify
    from ..launch_graph.graph_runner import GraphRunner
    from ..nodes.verify_driver import GraphGone, VerifyDriver
    cfg, config_path = _config(args)
    robot, sha = _load_model(args.model, args.robot)
    model = str(Path(args.model).resolve())
    log = io.StringIO()
    runner = GraphRunner(_nodes(model, args.robot or robot.name, config_path, args.seed),
                         out=log, env=_ros_env(args.domain_id), grace_s=3.0)
    thread = threading.Thread(target=runner.run, daemon=True)
    start = time.monotonic()
    print(f'verify {model} (sha256 {sha[:12]}): {cfg.episodes} episodes x {cfg.episode_s:g} s '
          f'at vx {cfg.command_vx:g} m/s through sim_node + policy_node (lockstep), '
          f'perturbations from {config_path}', flush=True)
    thread.start()
    driver = VerifyDriver(robot, thread.is_alive)
    episodes = []
    try:
        driver.start(cfg.command_vx, sha[:12])
        for i in range(cfg.episodes):
            ep = driver.episode(cfg.episode_s, cfg.settle_s)
            episodes.append(ep)
            if args.verbose:
                print(f'  episode {i + 1}: {"FELL" if ep.fell else "ok"} ' + ', '.join(
                    f'{k} {v}' for k, v in ep.params.items()), flush=True)
        latency = driver.latency()
    except GraphGone as exc:
        print(f'claw-rl verify: the graph failed: {exc}; node output:\n'
              + '\n'.join(log.getvalue().splitlines()[-40:]), flush=True)
        return 1
    finally:
        driver.close()
        runner.stop()
        thread.join(timeout=30)
    rows = verify.score(cfg, robot, episodes, **latency)
    print(verify.format_table(rows))
    path = verify.write_result(args.model, rows)
    print(f'wrote {path} ({time.monotonic() - start:.1f} s wall)', flush=True)
    return 0 if verify.passed(rows) else 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser('verify', help='sim2sim gate: the model through sim_node + '
                              'policy_node under perturbations; exit 0 pass, 1 fail',
                              description=__doc__, formatter_class=argparse.
                              RawDescriptionHelpFormatter)
    p.add_argument('--model', required=True, help='exported student (.onnx)')
    p.add_argument('--robot', default='', help="robot name or YAML (default: the model's)")
    p.add_argument('--config', default='verify.yaml', help='verify YAML: env: perturbations '
                   'and verify: thresholds (default: the package config/verify.yaml)')
    p.add_argument('--episodes', type=int, default=None, help='override verify.episodes')
    p.add_argument('--seconds', type=float, default=None, help='override verify.episode_s')
    p.add_argument('--seed', type=int, default=0, help='seed of the perturbation draws')
    p.add_argument('--domain-id', type=int, default=None,
                   help='ROS_DOMAIN_ID of the graph (default: a random one, localhost only)')
    p.add_argument('--verbose', action='store_true', help='print each episode and its draws')
    p.set_defaults(func=run_verify)
