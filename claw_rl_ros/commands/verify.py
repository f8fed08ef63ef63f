"""``claw-rl verify --model student.onnx``: the sim2sim gate through the real ROS path.

Starts the package's ``control`` graph (sim_node + policy_node, through the same graph runner
as ``claw-rl up``; both in one ``node_container`` process, or two processes with
``--processes``) in lockstep, with the sim node's perturbations from
``config/verify.yaml``, drives N episodes at a fixed forward command, prints the pass/fail table
(:mod:`claw_rl_ros.core.verify.gate_scoring`), writes ``<model stem>.verify.json`` beside the model
(and rewrites the policy card there, if there is one) and exits 0 (pass) or 1 (fail); 2 for a
usage error (missing or unusable model, bad config).

Why lockstep: the sim waits for each command, so the verdict does not depend on how loaded the
machine is (realtime on a busy machine adds random missed ticks that no robot has) and it runs
as fast as the loop allows; the ROS path (DDS, messages, the policy node's code and its model)
is the deployed one. Action latency (0-20 ms) is simulated in sim time: the sim delays each
command by a drawn number of physics substeps. The policy node's own wall-clock latency is
measured all the same and is a row of the table.

The graph runs in its own DDS domain (random ``ROS_DOMAIN_ID``, localhost discovery) unless
``--domain-id`` is given, so a verification never talks to a robot on the network.
``--jobs N`` runs N such graphs side by side (each in its own domain), sharing the episodes:
episode i draws its perturbations from (seed, i) whatever N is, so N changes the wall time, not
what is tested. Each sim node pauses by itself at its episode's end and sends the episode's
states as one record (the gate hears nothing per control step).

``--terrain TYPE[:LEVEL] ...`` (or ``all``: every type but flat, at the top level) adds a row
per terrain tile: the graph is started again for each with the sim node's world on that tile
(parameters ``terrain`` and ``terrain_seed``; the tile sizes and levels from the config's
``env.terrain``), the same perturbations, ``verify.episodes`` episodes each.

``--suite transfer`` runs the reality-gap table instead (:mod:`..core.verify.transfer_suite`):
one model error at a time (motor strength, gains, joint friction, rotor inertia, delays,
sensor biases, contacts, ground friction, payload, physics step, solver), in process (no DDS),
``--episodes`` per cell (default 2) of the verify config's length and command, scored by the
gate's limits; it prints a line per cell, writes ``<model stem>.transfer.json`` beside the
model (and the cells as a JSON list to ``--json OUT``), rewrites the policy card there if there
is one, and exits 0 when every cell passes, else 1; 2 for a usage error.

``--robot-overlay OVERLAY.yaml`` merges a robot overlay onto the robot (``claw-rl sysid
--out``): the gate's sim node and policy node get it as their ``robot_overlay`` parameter, the
transfer suite's cells and its second engine step the overlaid robot (its nominal delay the
overlay's). A model trained with an overlay needs the same one here.
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


def _load_model(model: str, robot_name: str, overlay: str = ''):
    """(RobotSpec, sha256, the checked overlay's absolute path or '') of a model that can
    drive the robot with ``overlay`` (--robot-overlay) merged; ConfigError otherwise."""
    from ..core.export.onnx_policy import ModelError, OnnxPolicy
    from ..core.sim.robot import load_robot
    from ..launch_graph.description import overlay_argument
    try:
        policy = OnnxPolicy(model)
        name = robot_name or policy.spec.get('robot', '')
        overlay = overlay_argument(overlay, name, '--robot-overlay', '')
        robot = load_robot(name, overlay=overlay)
        policy.check_robot(robot)
    except ModelError as exc:
        raise ConfigError('--model', '', str(exc)) from None
    return robot, policy.sha256, overlay


def verify_config(args: argparse.Namespace):
    """(VerifyConfig with the command-line overrides, absolute path of the YAML, the --terrain
    tiles of its env.terrain sizes)."""
    from ..core import paths
    from ..core.config import load_config, merge, to_dict, from_dict
    from ..core.verify.gate_scoring import VerifyConfig
    from ..core.sim.env_config import EnvConfig
    from ..core.sim.sim_session import terrain_tiles
    check_graphs(args.domain_id, args.jobs)
    path = paths.config_path(args.config).resolve()
    env = load_config(EnvConfig, path, 'env')  # the sim node would refuse it: refuse it here
    cfg = load_config(VerifyConfig, path, 'verify')
    overrides = {k: v for k, v in (('episodes', args.episodes), ('episode_s', args.seconds))
                 if v is not None}
    cfg = from_dict(VerifyConfig, merge(to_dict(cfg), overrides), source='claw-rl verify')
    # Each tile is long enough for a whole episode at the command (no walk ends at its edge).
    tiles = terrain_tiles(args.terrain or [], env.terrain, args.terrain_seed, '--terrain',
                          '--terrain-seed', include_flat=False,
                          walk=abs(cfg.command_vx) * cfg.episode_s)
    return cfg, path, tiles


DIAGNOSTICS_PERIOD_S = 0.1


def verify_nodes(model: str, robot_name: str, env_config: Path, seed: int,
                 tile=None, episode_s: float = 10.0, composed: bool = False,
                 overlay: str = '') -> list:
    """The control graph in lockstep, its sim node perturbed as config/verify.yaml says (and
    standing on ``tile``), pausing by itself ``episode_s`` after each reset, both nodes on the
    robot with ``overlay`` (a robot overlay, '' none); ``composed``: both nodes in one
    node_container process."""
    from ..launch_graph import GRAPHS, resolve
    from ..launch_graph.description import host
    nodes = resolve(GRAPHS['control'], {'model': model, 'robot': robot_name,
                                        'robot_overlay': overlay, 'mode': 'lockstep',
                                        'use_sim_time': 'true'})
    # Both nodes say their status 10x a second: the driver waits for the policy's at the end.
    status = {'diagnostics_period_s': DIAGNOSTICS_PERIOD_S}
    sim = {'randomization': True, 'pushes': True, 'noise': True, 'env_config': str(env_config),
           'seed': seed, 'reset_on_fall': True, 'command_timeout_s': 0.2, **status,
           'start_paused': True, 'pause_after_s': episode_s,  # the same steps every run
           **({'terrain': tile.label, 'terrain_seed': tile.seed,
               'overrides': f'env.terrain.tile_walk={tile.walk!r}'} if tile else {})}
    extra = {'sim_node': sim, 'policy_node': status}
    nodes = [dataclasses.replace(n, parameters={**n.parameters, **extra.get(n.executable, {})})
             for n in nodes]
    return [host('control_container', nodes, 'claw-rl verify')] if composed else nodes


# Fast DDS's default profile file (the newer name first): more discovery announcements.
PROFILE_VARIABLES = ('FASTDDS_DEFAULT_PROFILES_FILE', 'FASTRTPS_DEFAULT_PROFILES_FILE')


MAX_DOMAIN_ID = 232  # Fast DDS's port mapping has ports for domains 0 to 232
MAX_JOBS = 32


def check_graphs(domain_id: int | None, jobs: int) -> None:
    """ConfigError naming the option unless ``jobs`` graphs fit from ``domain_id`` on."""
    if jobs > MAX_JOBS:
        raise ConfigError('--jobs', '', f'{jobs}: use 1 to {MAX_JOBS} graphs (each is two '
                          'processes; 2 fill a 2-core machine)')
    if domain_id is not None and not 0 <= domain_id <= MAX_DOMAIN_ID - jobs + 1:
        raise ConfigError('--domain-id', '', f'{domain_id}: use 0 to {MAX_DOMAIN_ID - jobs + 1}'
                          f' (graph g of --jobs {jobs} takes domain {domain_id} + g, and DDS '
                          f'has ports up to domain {MAX_DOMAIN_ID})')


def graph_domains(domain_id: int | None, graphs: int) -> list[int]:
    """One DDS domain per graph (each has its own /clock and /diagnostics): ``domain_id`` and
    the next ones, or a random run of them (localhost only)."""
    first = domain_id if domain_id is not None else \
        random.SystemRandom().randint(1, 101 - graphs)
    return list(range(first, first + graphs))


def default_jobs() -> int:
    """Graphs run side by side: 2 on a machine with 2 cores or more (each lockstep loop waits
    on DDS part of a step: two loops fill 2 cores where one does not), else 1."""
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def _measure(args: argparse.Namespace, cfg, robot, sha: str, model: str, config_path: Path,
             seconds: float, tile=None, overlay: str = ''):
    """(episodes in index order, latency: the worst graph's, where the time went) of one run
    of ``args.jobs`` graphs sharing ``cfg.episodes``; GraphGone if one failed."""
    from ..core import paths
    from ..core.verify.episode_record import episode_steps
    from ..core.verify.gate_scoring import worst_latency
    from ..launch_graph.graph_runner import GraphRunner
    from ..core.verify.status_board import GraphGone
    jobs = max(1, min(args.jobs, cfg.episodes))
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'  # the drivers in this process
    if not any(os.environ.get(k) for k in PROFILE_VARIABLES):  # (a user's profile wins)
        os.environ[PROFILE_VARIABLES[0]] = str(paths.config_path('dds_discovery.xml'))
    logs, runners, threads, drivers = [], [], [], []
    episodes: list = [None] * cfg.episodes
    t0, up, done = time.monotonic(), [], []  # when each graph ran, when the last episode ended
    latency: list[dict[str, float]] = []
    failures: list[str] = []

    # Each graph takes the next episode as it is free (one that started late takes fewer);
    # episode i draws from (seed, i) wherever it runs.
    todo = iter(range(cfg.episodes))
    lock = threading.Lock()

    stopped: set[int] = set()

    def stop(g: int) -> None:
        with lock:  # (once: a second stop would skip the graph's grace period, as Ctrl-C does)
            if g in stopped or g >= len(runners):
                return
            stopped.add(g)
        runners[g].stop()

    def drive(g: int, driver) -> None:
        try:
            driver.start(cfg.command_vx, sha[:12])
            up.append(time.monotonic() - t0)
            began = None  # the policy's status count as this graph's last episode began
            while True:
                with lock:
                    i = next(todo, None)
                if i is None or failures:
                    break
                began = driver.board.count(driver.policy)
                episodes[i] = ep = driver.episode(seconds, cfg.settle_s, i)
                done.append(time.monotonic() - t0)
                if args.verbose:
                    print(f'  {tile.label + " " if tile else ""}episode {i + 1}: '
                          f'{"FELL" if ep.fell else "ok"} ' + ', '.join(
                              f'{k} {v}' for k, v in ep.params.items()), flush=True)
            if began is not None:  # (a graph that started last may have measured none)
                latency.append(driver.latency(began))
            # This graph is done: its processes stop while the others run their last episodes,
            # after its driver (below).
            driver.close()
            stop(g)
        except GraphGone as exc:
            failures.append(f'graph {g + 1} of {jobs}: {exc}; node output:\n' + '\n'.join(
                logs[g].getvalue().splitlines()[-40:]))

    try:
        # The node processes first: they start up while this process makes its drivers.
        domains = graph_domains(args.domain_id, jobs)
        for g, domain in enumerate(domains):
            nodes = verify_nodes(model, args.robot or robot.name, config_path, args.seed, tile,
                                 seconds, composed=not args.processes, overlay=overlay)
            logs.append(io.StringIO())
            env = {**os.environ, 'ROS_DOMAIN_ID': str(domain)}
            runners.append(GraphRunner(nodes, out=logs[g], env=env, grace_s=3.0))
            threads.append(threading.Thread(target=runners[g].run, daemon=True))
            threads[g].start()
        from ..nodes.verify_driver import VerifyDriver  # (rclpy: ~70 ms of imports)
        for g, domain in enumerate(domains):
            drivers.append(VerifyDriver(robot, threads[g].is_alive, domain_id=domain,
                                        name=f'verify_driver_{g + 1}'))
        workers = [threading.Thread(target=drive, args=(g, d)) for g, d in enumerate(drivers)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if failures:
            raise GraphGone(failures[0])
        steps = cfg.episodes * episode_steps(seconds, robot.control_dt)
        return episodes, worst_latency(latency), \
            f'graphs running after {min(up):.1f}-{max(up):.1f} s, {steps:,} steps in the next ' \
            f'{max(done) - min(up):.1f} s = {steps / (max(done) - min(up)):,.0f} steps/s'

    finally:
        # Each driver goes before its graph's nodes: Fast DDS 3.2 can deadlock a participant
        # that drops a peer's endpoints while its announcement timer runs (the receive thread
        # holds the discovery lock and waits on the event thread, which waits on the lock). In
        # a node that ends in the runner's SIGKILL; here rclpy would wait on it holding the
        # GIL, and the gate would hang (seen when the graphs stopped within the driver's first
        # 3 s, its 0.1 s initial announcements). A driver that goes first drops no peer.
        for d in drivers:
            d.close()
        for g in range(len(runners)):
            stop(g)
        for t in threads:
            t.join(timeout=30)


TRANSFER_EPISODES = 2  # per cell: the 24 cells x 2 x 10 s take ~11 s on a 2-core machine


def transfer_config(args: argparse.Namespace):
    """(VerifyConfig with --episodes (default TRANSFER_EPISODES) and --seconds, the raw
    ``env:`` section of the YAML) of ``--suite transfer``; ConfigError for what it cannot
    use."""
    from ..core import paths
    from ..core.config import from_dict, load_config, load_yaml, merge, to_dict
    from ..core.sim.env_config import EnvConfig
    from ..core.verify.episode_record import MAX_EPISODE_S
    from ..core.verify.gate_scoring import VerifyConfig
    if args.terrain:
        raise ConfigError('--terrain', '', 'the transfer suite runs on the flat plane; run '
                          '`claw-rl verify --terrain ...` without --suite transfer for tiles')
    path = paths.config_path(args.config).resolve()
    load_config(EnvConfig, path, 'env')  # refused here as a sim node would refuse it
    cfg = load_config(VerifyConfig, path, 'verify')
    overrides = {'episodes': TRANSFER_EPISODES if args.episodes is None else args.episodes,
                 **({} if args.seconds is None else {'episode_s': args.seconds})}
    cfg = from_dict(VerifyConfig, merge(to_dict(cfg), overrides),
                    source='claw-rl verify --suite transfer')
    if not cfg.episode_s <= MAX_EPISODE_S:  # (as the sim node refuses a longer pause_after_s)
        raise ConfigError('--seconds', '', f'{cfg.episode_s:g}: give at most {MAX_EPISODE_S:g} '
                          's per episode (a record of every step is kept)')
    if args.json:
        out = Path(args.json)
        if out.is_dir() or not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
            raise ConfigError('--json', '', f'{out}: cannot write a file there (give a file '
                              'path in an existing, writable directory)')
    return cfg, load_yaml(path).get('env') or {}


def run_transfer(args: argparse.Namespace) -> int:
    """``claw-rl verify --suite transfer``: the module docstring."""
    from ..core.export.policy_card import card_path, write_policy_card
    from ..core.verify import transfer_suite as suite
    cfg, env_section = transfer_config(args)
    robot, sha, overlay = _load_model(args.model, args.robot, args.robot_overlay)
    model = str(Path(args.model).resolve())
    cells = [*suite.CELLS, *suite.EXTRA_CELLS]
    print(f'transfer suite {model} (sha256 {sha[:12]}): {len(cells)} cells x {cfg.episodes} '
          f'episodes x {cfg.episode_s:g} s at vx {cfg.command_vx:g} m/s, seed {args.seed}, in '
          'process (SimSession + PolicyController)'
          + (f', robot overlay {overlay}' if overlay else ''), flush=True)
    start = time.monotonic()
    fmt = suite.TableFormat(cfg, cells)
    print(fmt.header(), flush=True)
    results = suite.run_suite(model, robot, cfg, env_section, args.seed,
                              on_cell=lambda r: print(fmt.row(r), flush=True))
    print(fmt.verdict(results), flush=True)
    written: list = []
    try:
        written.append(suite.write_record(args.model, cfg, args.seed, results, overlay))
        if args.json:
            written.append(suite.write_json(args.json, results))
    except OSError as exc:
        raise ConfigError('--json' if written else '--model', '',
                          f'cannot write the result: {exc}') from None
    print(f'wrote {", ".join(map(str, written))} ({time.monotonic() - start:.1f} s wall)',
          flush=True)
    if card_path(args.model).is_file():  # the card shows the cells
        print(f'updated {write_policy_card(args.model)}', flush=True)
    return 0 if suite.passed(results) else 1


def run_verify(args: argparse.Namespace) -> int:
    # Nothing of the gate renders: MuJoCo without its OpenGL context loader (~40 ms of every
    # process that imports it: this one, each sim and policy node), unless the user chose one.
    os.environ.setdefault('MUJOCO_GL', 'disable')
    from ..core.verify import gate_scoring as verify
    from ..core.export.policy_card import card_path, write_policy_card
    from ..core.sim.terrain import generate_terrain
    from ..core.verify.status_board import GraphGone
    if args.suite == 'transfer':
        return run_transfer(args)
    if args.json:
        raise ConfigError('--json', '', 'the cells of --suite transfer; the gate writes '
                          '<model stem>.verify.json')
    cfg, config_path, tiles = verify_config(args)
    robot, sha, overlay = _load_model(args.model, args.robot, args.robot_overlay)
    model = str(Path(args.model).resolve())
    start = time.monotonic()
    ground = f', then on {", ".join(t.label for t in tiles)} (seed {args.terrain_seed})' \
        if tiles else ''
    print(f'verify {model} (sha256 {sha[:12]}): {cfg.episodes} episodes x {cfg.episode_s:g} s '
          f'at vx {cfg.command_vx:g} m/s through sim_node + policy_node (lockstep, '
          f'{"two processes" if args.processes else "one process"}), '
          f'perturbations from {config_path}{ground}'
          + (f', robot overlay {overlay}' if overlay else ''), flush=True)
    terrain_rows = []
    try:
        episodes, latency, timing = _measure(args, cfg, robot, sha, model, config_path,
                                             cfg.episode_s, overlay=overlay)
        for tile in tiles:
            seconds = verify.terrain_episode_s(cfg, generate_terrain(tile.config, robot), robot)
            runs, _, _ = _measure(args, cfg, robot, sha, model, config_path, seconds, tile,
                                  overlay)
            terrain_rows.append(verify.score_terrain(cfg, tile.label, tile.seed, runs, seconds))
    except GraphGone as exc:
        print(f'claw-rl verify: the graph failed: {exc}', flush=True)
        return 1
    rows = verify.score(cfg, robot, episodes, **latency)
    print(verify.format_table(rows, terrain_rows))
    path = verify.write_result(args.model, rows, terrain_rows)
    print(f'wrote {path} ({time.monotonic() - start:.1f} s wall; flat: {timing})', flush=True)
    if card_path(args.model).is_file():  # the card shows what it was verified on
        print(f'updated {write_policy_card(args.model)}', flush=True)
    return 0 if verify.passed(rows, terrain_rows) else 1


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (the message names the value)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f'{text!r} is not a whole number >= 1')
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser('verify', help='sim2sim gate: the model through sim_node + '
                              'policy_node under perturbations; exit 0 pass, 1 fail',
                              description=__doc__, formatter_class=argparse.
                              RawDescriptionHelpFormatter)
    p.add_argument('--model', required=True, help='exported student (.onnx)')
    p.add_argument('--robot', default='', help="robot name or YAML (default: the model's)")
    p.add_argument('--robot-overlay', metavar='OVERLAY.yaml', default='',
                   help='robot overlay merged onto the robot (claw-rl sysid --out): the sim and '
                   'policy nodes get it (robot_overlay), the transfer suite steps the overlaid '
                   'robot; a model trained with one needs the same (default: none)')
    p.add_argument('--config', default='verify.yaml', help='verify YAML: env: perturbations '
                   'and verify: thresholds (default: the package config/verify.yaml)')
    p.add_argument('--episodes', type=int, default=None, help='override verify.episodes')
    p.add_argument('--seconds', type=float, default=None, help='override verify.episode_s')
    p.add_argument('--seed', type=int, default=0, help='seed of the perturbation draws')
    p.add_argument('--terrain', nargs='+', metavar='TYPE[:LEVEL]',
                   help='also a row per terrain tile: TYPE one of rough, slope_up, slope_down, '
                   'stairs_up, stairs_down, obstacles, LEVEL 0..num_levels - 1 of the config\'s '
                   'env.terrain (default the top level); all: every one of them')
    p.add_argument('--terrain-seed', type=int, default=1000,
                   help='seed of the terrain heights (default 1000; training uses 0)')
    p.add_argument('--domain-id', type=int, default=None,
                   help='ROS_DOMAIN_ID of the (first) graph, the next graphs the next ones '
                   '(default: random ones, localhost only)')
    p.add_argument('--jobs', type=positive_int, default=default_jobs(),
                   help='control graphs run side by side, sharing the episodes (default '
                   f'{default_jobs()} here: 2 with 2 cores or more); the verdict does not '
                   'depend on it: episode i draws the same perturbations on any number')
    p.add_argument('--processes', action='store_true',
                   help="each graph's sim_node and policy_node as two processes, as the policy "
                   'node runs on a robot (default: both in one node_container process, the '
                   'same nodes and messages without the hop between processes: the same '
                   'verdict, ~1.5x the control steps/s)')
    p.add_argument('--verbose', action='store_true', help='print each episode and its draws')
    p.add_argument('--suite', choices=('gate', 'transfer'), default='gate',
                   help='gate (default): the sim2sim gate above; transfer: the reality-gap '
                   'table, one model error per cell, in process, exit 0 when every cell passes '
                   f'(--episodes per cell, default {TRANSFER_EPISODES})')
    p.add_argument('--json', metavar='OUT', default='',
                   help='--suite transfer: also write the cells as a JSON list here')
    p.set_defaults(func=run_verify, exit_without_teardown=True)
