"""Live training with the actors on another host: loopback vs real and shaped links, one run.

Every case is the live train graph without its control loop (trainer_node + --actors
actor_nodes, --num-envs in total, overlap: two chunks in flight, max_policy_lag 2), config
train_ppo.yaml, run back to back on one machine (root: Linux network namespaces as hosts,
test/netns.py):

- ``loopback``: trainer and actors in one namespace (``LOCALHOST`` discovery): the baseline;
- ``veth``: trainer host and actor host on a bridge, veth links, multicast discovery (SUBNET);
- ``emulated``: the actor host's link through test/link_emulator.py unshaped (what forwarding
  frames in user space costs), then shaped per direction: ``lan`` 100 Mbit/s, 2 ms and
  ``wifi`` 20 Mbit/s, 20 ms, 1 % frame loss (this kernel has no ``netem``, so rate, delay and
  loss are made in user space);
- then every other ``--encodings`` (``actor_node``'s ``chunk_encoding``) x ``--transports``
  (``udp``: Fast DDS's default; ``large_data``: its ``LARGE_DATA`` builtin transports, user
  data over TCP, see :data:`TRANSPORTS`) on loopback and the shaped links.

Throughput counts env steps the trainer used per second of wall time, from its metrics.csv,
after ``--warmup`` iterations. Link use is the bytes the trainer host received on its link per
env step. The emulator's CPU time is printed beside (on 2 cores it competes with the nodes).

    sudo .venv/bin/python bench/multihost.py [--iterations 10] [--warmup 3] [--num-envs 256]
        [--actors 2] [--cases loopback veth emulated lan wifi] [--encodings raw zstd_f16]
        [--transports udp large_data large_data_plain]
"""

from __future__ import annotations

import argparse
import csv
import os
from pathlib import Path
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'test'))
sys.path.insert(0, str(ROOT / 'bench'))

from live_training import bench_config  # noqa: E402
from netns import host_env, HostNode, Link, Network  # noqa: E402

#: name: None (one host), 'veth' or the emulated Link of the actor host.
CASES = {'loopback': None, 'veth': 'veth', 'emulated': Link(), 'lan': Link(100, 2),
         'wifi': Link(20, 20, 0.01, seed=1)}
LABELS = {'loopback': 'loopback (one host)', 'veth': 'veth + bridge',
          'emulated': 'emulated, unshaped', 'lan': 'LAN: 100 Mbit/s, 2 ms',
          'wifi': 'Wi-Fi: 20 Mbit/s, 20 ms, 1 % loss'}


def steady(run_dir: Path, warmup: int) -> dict:
    """Env steps/s after ``warmup`` iterations and the last row of metrics.csv."""
    path = run_dir / 'metrics.csv'
    rows = list(csv.DictReader(open(path, newline=''))) if path.exists() else []
    if not rows:
        return {'rate': float('nan'), 'iterations': 0, 'last': {}, 'total_steps': 0.0}
    last = rows[-1]
    # a run that never got past the warm-up is measured from its start (start-up included)
    first = rows[warmup - 1] if len(rows) > warmup else {'total_steps': 0, 'wall_time_s': 0}
    steps = float(last['total_steps']) - float(first['total_steps'])
    seconds = float(last['wall_time_s']) - float(first['wall_time_s'])
    return {'rate': steps / seconds, 'iterations': len(rows), 'last': last,
            'total_steps': float(last['total_steps']), 'steady': len(rows) > warmup}


#: DDS transports: Fast DDS's defaults (UDP; shared memory within a host), or its LARGE_DATA
#: builtin transports (UDP discovery, user data over TCP: congestion control and retransmission
#: by the kernel) with the socket sizes and non-blocking send its documentation recommends for
#: large messages (plain ``LARGE_DATA`` deadlocked on the 100 Mbit/s link: both ends' TCP
#: receive queues full, the trainer frozen), set with one environment variable on every host.
LARGE_DATA = 'LARGE_DATA?max_msg_size=4MB&sockets_size=8MB&non_blocking=true'
TRANSPORTS = {'udp': {}, 'large_data': {'FASTDDS_BUILTIN_TRANSPORTS': LARGE_DATA},
              'large_data_plain': {'FASTDDS_BUILTIN_TRANSPORTS': 'LARGE_DATA'}}


def run_case(tmp: Path, name: str, link, encoding: str, transport: str, cfg: Path,
             args) -> dict:
    """One live run; see the module docstring."""
    slug = ''.join(c if c.isalnum() else '_' for c in f'{name}_{encoding}_{transport}')
    run_dir, logs = tmp / slug, tmp / f'{slug}_logs'
    logs.mkdir()
    domain = random.SystemRandom().randint(1, 100)
    hosts = ['t'] if link is None else ['t', 'a']
    links = {'a': link} if isinstance(link, Link) else {}
    actor_host = hosts[-1]
    discovery = 'LOCALHOST' if link is None else 'SUBNET'
    names = [f'/a{i}/actor' for i in range(args.actors)]

    def env(host):
        return {**host_env(logs, host, domain, discovery, ''), **TRANSPORTS[transport]}
    with Network(hosts, links=links) as net:
        trainer = HostNode(net, 't', 'trainer_node', env('t'), logs, {
            'config': str(cfg), 'run_dir': str(run_dir), 'push_targets': names,
            'chunks_per_iteration': args.actors, 'max_policy_lag': 2,
            'time_budget_s': args.budget_s}, name='trainer')
        actors = [HostNode(net, actor_host, 'actor_node', env(actor_host), logs,
                           {'config': str(cfg), 'num_envs': args.num_envs // args.actors,
                            'seed': i, 'chunks_in_flight': 2, 'chunk_encoding': encoding},
                           namespace=f'/a{i}') for i in range(len(names))]
        start = time.monotonic()
        try:
            trainer.proc.wait(timeout=args.budget_s + 120)
        except subprocess.TimeoutExpired:
            pass
        wall = time.monotonic() - start
        rx = net.rx_bytes('t') if link is not None else 0
        cpu = net.emulator_cpu_s('a') if links else 0.0
        code = trainer.stop()
        for actor in actors:
            actor.stop()
    if code != 0:  # (a hung trainer is killed: recorded, the other runs go on)
        print(f'{name} / {encoding} / {transport}: trainer exited {code}; see '
              f'{trainer.log_path}', flush=True)
    out = steady(run_dir, args.warmup)
    out.update(code=code, wall_s=wall, rx_bytes=rx, emulator_cpu_s=cpu,
               report=net.link_reports.get('a'))
    return out


def plan(args) -> list[tuple[str, str, str]]:
    """(case, encoding, transport) of every run: each case as is (raw, udp), then every other
    encoding x transport on loopback and the shaped cases."""
    runs = [(name, 'raw', 'udp') for name in args.cases]
    shaped = [n for n in args.cases if isinstance(CASES[n], Link) and CASES[n].rate_mbit]
    for transport in args.transports:
        for encoding in args.encodings:
            if (encoding, transport) != ('raw', 'udp'):
                runs += [(n, encoding, transport) for n in ['loopback'] * ('loopback' in
                                                                           args.cases) + shaped]
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--iterations', type=int, default=10, help='measured iterations')
    parser.add_argument('--warmup', type=int, default=3, help='iterations not measured')
    parser.add_argument('--num-envs', type=int, default=256, help='worlds in total')
    parser.add_argument('--actors', type=int, default=2, help='actor processes (one host)')
    parser.add_argument('--budget-s', type=float, default=180.0,
                        help='training time cap of one run (a slow link may not finish)')
    parser.add_argument('--cases', nargs='+', default=list(CASES), choices=list(CASES))
    parser.add_argument('--encodings', nargs='+', default=['raw', 'zstd_f16'],
                        help='actor_node chunk_encoding values (raw, zstd, zstd_f16)')
    parser.add_argument('--transports', nargs='+', default=['udp', 'large_data'],
                        choices=list(TRANSPORTS))
    parser.add_argument('--keep', metavar='DIR', help='keep the run directories here')
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit('bench/multihost.py needs root (network namespaces, TAP devices)')
    tmp = Path(tempfile.mkdtemp(prefix='multihost_bench_', dir=args.keep))
    cfg = bench_config(tmp, args.num_envs, args.warmup + args.iterations)
    results = {}
    try:
        for run in plan(args):
            results[run] = r = run_case(tmp, run[0], CASES[run[0]], run[1], run[2], cfg, args)
            print(f'{" / ".join(run)}: {r["rate"]:,.0f} steps/s over {r["iterations"]} '
                  'iterations', flush=True)
    finally:
        if args.keep:
            print(f'run directories kept in {tmp}')
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    report(results, args)
    return 0


def report(results: dict, args) -> None:
    base = results.get(('loopback', 'raw', 'udp'), {}).get('rate', float('nan'))
    print(f'\n{args.num_envs} worlds ({args.actors} actors x {args.num_envs // args.actors}) x 24 '
          f'steps, chunks_per_iteration {args.actors}, {args.iterations} iterations measured '
          f'after {args.warmup} (or what {args.budget_s:g} s of training made); trainer host '
          'and actor host in network namespaces. steps/s: env steps the trainer learnt from per '
          'second; link: what the trainer host received over the run, per second and per env '
          'step learnt from\n')
    print(f'{"link":>33} {"encoding":>8} {"transport":>10} {"steps/s":>8} {"x loopback":>10} '
          f'{"dropped":>7} {"link Mbit/s":>11} {"B/step":>7} {"emulator CPU":>12}')
    for (name, encoding, transport), r in results.items():
        steps = r.get('total_steps') or float('nan')
        # loopback has no link to count: '-'
        per_step = f'{r["rx_bytes"] / steps:7.0f}' if r['rx_bytes'] else '-'
        mbit = f'{r["rx_bytes"] * 8 / r["wall_s"] / 1e6:11.1f}' if r['rx_bytes'] else '-'
        dropped = float(r['last'].get('dropped_fraction', 'nan'))
        cpu = f'{r["emulator_cpu_s"] / r["wall_s"]:.0%} core' if r['emulator_cpu_s'] else '-'
        note = '' if r.get('steady') else f'  only {r["iterations"]} iterations, from start'
        print(f'{LABELS[name]:>33} {encoding:>8} {transport:>10} {r["rate"]:8,.0f} '
              f'{r["rate"] / base:10.2f} {dropped:7.1%} {mbit:>11} {per_step:>7} {cpu:>12}'
              + note + (f'  trainer exit {r["code"]}' if r['code'] else ''))
    for run, r in results.items():
        if r['report']:
            print(f'\nemulator, {" / ".join(run)}:\n  ' + r['report'].replace('\n', '\n  '))


if __name__ == '__main__':
    raise SystemExit(main())
