"""Actors on other hosts feed one trainer over a real network link: three Linux network
namespaces (trainer host, two actor hosts) on one bridge, DDS discovery crossing it, as root.

* multicast discovery (``ROS_AUTOMATIC_DISCOVERY_RANGE=SUBNET``), and links without multicast
  where only ``ROS_STATIC_PEERS`` finds the other hosts (``LOCALHOST`` + static peers);
* iterations use chunks of both remote actors and the pushed models are acknowledged by both;
* a link down longer than the batch timeout, then up: training goes on with the other host,
  the actor rejoins, acts with the current model and its chunks are used again;
* a host that disappears for good (processes killed, namespace deleted): training goes on;
* nothing is lost: every iteration is in metrics.csv, the newest checkpoint loads and holds the
  last iteration.

The trainer's DEBUG log is the record waited on (the test process is outside the namespaces,
so it has no probe on their graph).
"""

from __future__ import annotations

import csv
import random
import re

import pytest

from netns import host_env, HostNode, Network, require_netns, wait_for_line
from test_nodes_trainer import TINY_YAML, zero_chunk

BATCH_TIMEOUT_S = 2.0


@pytest.fixture(scope='module', autouse=True)
def _gate():
    require_netns()


def chunk_bytes(robot) -> int:
    """Encoded size of one chunk of the tiny config (8 steps x 8 worlds)."""
    from claw_rl_ros.core.live.rollout_chunk import encode_chunk
    return len(encode_chunk(zero_chunk(robot, t=8, n=8)))


ITERATION = re.compile(r'iteration (\d+): (\d+) chunks from (.*), mean reward')


def iterations(log: str) -> list[tuple[int, set[str]]]:
    """(iteration, the actors whose chunks it used) of every iteration the trainer logged."""
    return [(int(m.group(1)), set(m.group(3).split(', '))) for m in ITERATION.finditer(log)]


def used_both(line: str) -> bool:
    m = ITERATION.search(line)
    return bool(m) and set(m.group(3).split(', ')) == {'/b/actor', '/c/actor'}


def used(actor: str):
    return lambda line: bool(ITERATION.search(line)) and actor in ITERATION.search(line)[3]


def acked(actor: str):
    return lambda line: f'{actor} now acts with' in line


@pytest.mark.parametrize('discovery', ['multicast', 'static_peers'])
def test_remote_actors_train_over_the_link_and_survive_link_and_host_faults(
        tmp_path, robot, discovery):
    multicast = discovery == 'multicast'
    config = tmp_path / 'tiny.yaml'
    config.write_text(TINY_YAML)
    run_dir = tmp_path / 'run'
    domain = random.SystemRandom().randint(1, 100)
    with Network(['t', 'b', 'c'], multicast=multicast) as net:
        def env(host):
            others = [h for h in ('t', 'b', 'c') if h != host]
            return host_env(tmp_path, host, domain, 'SUBNET' if multicast else 'LOCALHOST',
                            '' if multicast else net.addresses(*others))
        trainer = HostNode(net, 't', 'trainer_node', env('t'), tmp_path, {
            'config': str(config), 'run_dir': str(run_dir), 'chunks_per_iteration': 2,
            'batch_timeout_s': BATCH_TIMEOUT_S, 'push_targets': ['/b/actor', '/c/actor']},
            name='trainer', debug=True)
        actors = {h: HostNode(net, h, 'actor_node', env(h), tmp_path, {
            'config': str(config), 'seed': i, 'credit_timeout_s': 5.0}, namespace=f'/{h}')
            for i, h in enumerate(('b', 'c'))}
        try:
            # Both remote actors' chunks make iterations; both acknowledge pushed models.
            wait_for_line(trainer.log_path, used_both, 240, what='used both remote actors')
            for h in ('b', 'c'):
                wait_for_line(trainer.log_path, acked(f'/{h}/actor'), 60)
                wait_for_line(trainer.log_path, lambda line, h=h:
                              f'/{h}/actor joined: first chunk accepted' in line, 10)
            # Host b's link goes down for 4 batch timeouts: iterations go on with c alone.
            mark = trainer.size()
            net.set_link('b', up=False)
            wait_for_line(trainer.log_path, lambda line: bool(ITERATION.search(line)) and
                          ITERATION.search(line)[3] == '/c/actor', 60, start=mark,
                          what='used /c/actor alone while b was cut off')
            down = wait_for_line(trainer.log_path, lambda line: bool(ITERATION.search(line)),
                                 60, start=trainer.size())
            wait_for_line(trainer.log_path, lambda line: bool(ITERATION.search(line)) and
                          int(ITERATION.search(line)[1]) >=
                          int(ITERATION.search(down)[1]) + 3, 60, start=mark)
            during = trainer.log[mark:]
            assert all(a == {'/c/actor'} for _, a in iterations(during)[1:]), during
            # Said once, as a warning, not once per iteration.
            assert during.count('/b/actor silent: no chunk for') == 1, during
            assert re.search(r'\[WARN\].*/b/actor silent', during), during
            # Back up: b acts with a model pushed after the cut and its chunks count again.
            mark = trainer.size()
            net.set_link('b', up=True)
            wait_for_line(trainer.log_path, acked('/b/actor'), 120, start=mark,
                          what='acknowledged by /b/actor after the link came back')
            wait_for_line(trainer.log_path, used_both, 120, start=mark,
                          what='used /b/actor again after the link came back')
            # ... saying where the chunk that ended the silence spent its time (the actor's
            # timings travel in the chunk).
            assert re.search(r'\[INFO\].*/b/actor is back: chunk accepted after [\d.]+ s '
                             r'without one \(before it the actor idled [\d.]+ s .* collected it '
                             r'in [\d.]+ s .* accepted -?[\d.]+ s after its collection ended\)',
                             trainer.log[mark:]), trainer.log[mark:]
            # Host c disappears for good: training goes on with b.
            net.remove('c')
            mark = trainer.size()
            first = wait_for_line(trainer.log_path, used('/b/actor'), 60, start=mark)
            wait_for_line(trainer.log_path, lambda line: used('/b/actor')(line) and
                          int(ITERATION.search(line)[1]) >= int(ITERATION.search(first)[1]) + 3,
                          60, start=mark, what='three more iterations after c was deleted')
            after = iterations(trainer.log[mark:])
            assert all(a == {'/b/actor'} for _, a in after[1:]), after
            assert trainer.log[mark:].count('/c/actor silent: no chunk for') == 1
            # Every accepted chunk crossed the trainer host's link (no shortcut through
            # shared memory or loopback): it received more bytes than the chunks hold.
            chunks = sum(int(m.group(2)) for m in ITERATION.finditer(trainer.log))
            assert net.rx_bytes('t') > chunks * chunk_bytes(robot), (net.rx_bytes('t'), chunks)
        finally:
            codes = {'trainer': trainer.stop(), 'b': actors['b'].stop()}
            actors['c'].stop()
        log = trainer.log
        assert codes == {'trainer': 0, 'b': 0}, (codes, log[-3000:])
    # Nothing lost: every iteration logged once, in order, in metrics.csv; the newest
    # checkpoint loads and is the last iteration's.
    from claw_rl_ros.core.learning import checkpoint as ckpt
    done = [i for i, _ in iterations(log)]
    assert done == list(range(1, len(done) + 1)), done
    with open(run_dir / 'metrics.csv') as f:
        rows = [int(float(r['iteration'])) for r in csv.DictReader(f)]
    assert rows == done, (rows, done)
    last = ckpt.latest_checkpoint(run_dir)
    assert last == ckpt.checkpoint_path(run_dir, done[-1])
    assert int(ckpt.load_checkpoint(last)['iteration']) == done[-1]
