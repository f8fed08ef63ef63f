"""Hosts on one machine for multi-host tests: Linux network namespaces on one switch (root only).

:class:`Network` makes a namespace per host plus one ``switch`` namespace holding a bridge; each
host's ``eth0`` (a veth pair) is plugged into the bridge, with an address of its own on
``10.<net>.0.0/24``. It runs processes inside a host (``ip netns exec``), takes a host's link
down and up (the switch-side end: the host sees its carrier go), shapes a link with ``tc``
(``tbf``: rate; this kernel has no ``netem``), and deletes a host for good (its processes are
SIGKILLed, then its namespace goes). A host given a :class:`Link` in ``links`` is plugged in
through ``link_emulator.py`` instead of a veth pair (TAP devices, rate + delay + loss in user
space), for the delay and loss ``tbf`` cannot make. :meth:`Network.close` (also run on any
exception inside ``with``) kills every process of every host and deletes every namespace, so a
failed test leaves nothing behind; namespaces an earlier, killed run left are removed at the
next start. :class:`HostNode` runs a node inside a host, logging to a file.

:func:`require_netns` is the gate: for root it makes a throw-away namespace and fails loudly
when it cannot; for anyone else it fails with a one-line reason (never a skip).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
import os
from pathlib import Path
import random
import select
import signal
import subprocess
import sys
import time

import pytest

from ros_helpers import node_command, NodeProcess, ROOT

PREFIX = 'clawnet'  # every namespace these tests make starts with this
NEED_ROOT = 'network-namespace tests need root (ip netns, veth); run make test as root'


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``ip <args>``; a failure raises with the command and what it printed."""
    done = subprocess.run(['ip', *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f'ip {" ".join(args)} failed ({done.returncode}): '
                           f'{done.stderr.strip() or done.stdout.strip()}')
    return done


def namespaces() -> list[str]:
    out = ip('netns', 'list', check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def kill_namespace(ns: str) -> None:
    """SIGKILL every process in ``ns``, then delete it (missing: nothing to do)."""
    if ns not in namespaces():
        return
    pids = ip('netns', 'pids', ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    ip('netns', 'del', ns, check=False)


def remove_leftovers() -> None:
    """Namespaces of a run whose pytest process is gone (killed before its cleanup)."""
    for ns in namespaces():
        if not ns.startswith(PREFIX):
            continue
        owner = ns[len(PREFIX):].split('_')[0]
        if owner.isdigit() and not os.path.exists(f'/proc/{owner}'):
            kill_namespace(ns)


def require_netns() -> None:
    """Fail loudly, naming why, when namespaces cannot be made (never a skip)."""
    if os.geteuid() != 0:
        pytest.fail(f'{NEED_ROOT} (.ci/run runs as root)')
    probe = f'{PREFIX}{os.getpid()}_probe'
    try:
        ip('netns', 'add', probe)
        ip('-n', probe, 'link', 'add', 'va', 'type', 'veth', 'peer', 'name', 'vb')
    except (OSError, RuntimeError) as exc:
        pytest.fail(f'cannot make network namespaces and veth links as root: {exc}')
    finally:
        kill_namespace(probe)


class Host:
    """One namespace: its name, address and the switch-side end of its link."""

    def __init__(self, name: str, ns: str, address: str, port: str):
        self.name, self.ns, self.address, self.port = name, ns, address, port

    def command(self, cmd: list[str]) -> list[str]:
        return ['ip', 'netns', 'exec', self.ns, *cmd]


@dataclass(frozen=True)
class Link:
    """A host's link made by ``link_emulator.py`` (each direction): Mbit/s (0: unlimited),
    one-way delay and frame loss probability."""

    rate_mbit: float = 0.0
    delay_ms: float = 0.0
    loss: float = 0.0
    seed: int = 0

    def args(self) -> list[str]:
        return ['--rate-mbit', f'{self.rate_mbit:g}', '--delay-ms', f'{self.delay_ms:g}',
                '--loss', f'{self.loss:g}', '--seed', str(self.seed)]


class Network:
    """Hosts on one bridged /24; see the module docstring. ``multicast`` False: the switch
    floods no multicast to any port (and the hosts have no multicast route), as on networks
    where discovery must be unicast. ``links``: hosts plugged in through an emulated link."""

    def __init__(self, hosts: list[str], multicast: bool = True,
                 links: dict[str, Link] | None = None):
        remove_leftovers()
        self.tag = f'{PREFIX}{os.getpid()}_{random.SystemRandom().randint(0, 9999)}'
        net = random.SystemRandom().randint(100, 250)
        self.switch = f'{self.tag}_sw'
        self.hosts: dict[str, Host] = {}
        self.procs: list[subprocess.Popen] = []
        self.emulators: dict[str, subprocess.Popen] = {}
        self.link_reports: dict[str, str] = {}  # host: the emulator's counters, after close
        try:
            ip('netns', 'add', self.switch)
            ip('-n', self.switch, 'link', 'add', 'br0', 'type', 'bridge')
            ip('-n', self.switch, 'link', 'set', 'br0', 'up')
            for i, name in enumerate(hosts, start=1):
                self._add(name, f'10.{net}.0.{i}', f'p{i}', multicast, (links or {}).get(name))
        except BaseException:
            self.close()
            raise

    def _add(self, name: str, address: str, port: str, multicast: bool,
             link: Link | None) -> None:
        ns = f'{self.tag}_{name}'
        ip('netns', 'add', ns)
        self.hosts[name] = Host(name, ns, address, port)
        ip('-n', ns, 'link', 'set', 'lo', 'up')
        if link is None:
            ip('-n', ns, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', port,
               'netns', self.switch)
        else:
            self._emulate(name, ns, port, link)
        ip('-n', ns, 'addr', 'add', f'{address}/24', 'dev', 'eth0')
        ip('-n', ns, 'link', 'set', 'eth0', 'multicast', 'on' if multicast else 'off')
        ip('-n', ns, 'link', 'set', 'eth0', 'up')
        if multicast:  # DDS discovery sends to 239.255.0.1: route it out of the link
            ip('-n', ns, 'route', 'add', '224.0.0.0/4', 'dev', 'eth0')
        ip('-n', self.switch, 'link', 'set', port, 'master', 'br0')
        if not multicast:  # the switch forwards no multicast: discovery has to be unicast
            ip('-n', self.switch, 'link', 'set', port, 'type', 'bridge_slave', 'mcast_flood',
               'off')
        ip('-n', self.switch, 'link', 'set', port, 'up')

    def _emulate(self, name: str, ns: str, port: str, link: Link) -> None:
        """The emulator opens TAPs ``h<port>`` and ``<port>`` in the switch namespace; the
        first moves into the host as its ``eth0``, the second stays as the bridge port."""
        emulator = subprocess.Popen(
            ['ip', 'netns', 'exec', self.switch, sys.executable, '-u',
             str(Path(__file__).with_name('link_emulator.py')), '--tap', f'h{port}', '--tap',
             port, *link.args()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.emulators[name] = emulator
        line = emulator.stdout.readline()
        if line.strip() != 'ready':
            raise RuntimeError(f'link emulator of {name} did not start: '
                               f'{line}{emulator.stdout.read() if emulator.poll() else ""}')
        ip('-n', self.switch, 'link', 'set', f'h{port}', 'netns', ns)
        ip('-n', ns, 'link', 'set', f'h{port}', 'name', 'eth0')

    def emulator_cpu_s(self, host: str) -> float:
        """CPU seconds (user + system) the host's link emulator has used so far."""
        fields = Path(f'/proc/{self.emulators[host].pid}/stat').read_text().rsplit(')', 1)[1]
        utime, stime = fields.split()[11:13]
        return (int(utime) + int(stime)) / os.sysconf('SC_CLK_TCK')

    def _stop_emulators(self) -> None:
        for host, emulator in self.emulators.items():
            if emulator.poll() is None:
                emulator.terminate()
            try:
                out, _ = emulator.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                emulator.kill()
                out, _ = emulator.communicate()
            self.link_reports[host] = out.strip()
        self.emulators.clear()

    def __enter__(self) -> 'Network':
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def addresses(self, *names: str) -> str:
        """``ROS_STATIC_PEERS`` value for these hosts (all when none given)."""
        return ';'.join(self.hosts[n].address for n in (names or self.hosts))

    def popen(self, host: str, cmd: list[str], **kwargs) -> subprocess.Popen:
        """Start ``cmd`` inside ``host`` (its processes are killed by :meth:`close`)."""
        proc = subprocess.Popen(self.hosts[host].command(cmd), **kwargs)
        self.procs.append(proc)
        return proc

    def set_link(self, host: str, up: bool) -> None:
        """The host's link down (cable pulled at the switch: the host loses carrier) or up."""
        ip('-n', self.switch, 'link', 'set', self.hosts[host].port, 'up' if up else 'down')

    def shape(self, host: str, rate_mbit: float) -> None:
        """``tbf`` at ``rate_mbit`` on both ends of the host's link (each direction)."""
        for ns, dev in ((self.hosts[host].ns, 'eth0'), (self.switch, self.hosts[host].port)):
            subprocess.run(['ip', 'netns', 'exec', ns, 'tc', 'qdisc', 'replace', 'dev', dev,
                            'root', 'tbf', 'rate', f'{rate_mbit}mbit', 'burst', '64kb',
                            'latency', '200ms'], check=True, capture_output=True)

    def rx_bytes(self, host: str) -> int:
        """Bytes the host has received on its link (``eth0``)."""
        import json
        link = json.loads(ip('-n', self.hosts[host].ns, '-s', '-j', 'link', 'show', 'eth0').stdout)
        return int(link[0]['stats64']['rx']['bytes'])

    def remove(self, host: str) -> None:
        """The host disappears for good: its processes SIGKILLed, its namespace deleted."""
        kill_namespace(self.hosts.pop(host).ns)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        self._stop_emulators()
        for host in list(self.hosts):
            self.remove(host)
        kill_namespace(self.switch)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()


class HostNode(NodeProcess):
    """A node process inside a host's namespace, logging to a file; ``stop`` as NodeProcess's
    (SIGINT first), with the time a trainer needs to write its summary."""

    def __init__(self, net: Network, host: str, node: str, env: dict, log_dir: Path,
                 params: dict, namespace: str = '', name: str = '', debug: bool = False):
        self.name = name or f'{node}{namespace.replace("/", "_")}'
        self.log_path = Path(log_dir) / f'{self.name}.log'
        cmd = node_command(node, params, [f'__ns:={namespace}'] if namespace else [],
                           'debug' if debug else None, name or node)
        self._log = open(self.log_path, 'w')
        self.proc = net.popen(host, cmd, cwd=ROOT, env=env, stdout=self._log,
                              stderr=subprocess.STDOUT)

    def size(self) -> int:
        return len(self.log)

    def stop(self, timeout: float = 120.0) -> int:
        return super().stop(timeout)


def host_env(tmp_path: Path, host: str, domain: int, discovery: str, peers: str) -> dict:
    """The environment of a process on ``host``: one domain for all, ROS_HOME of its own."""
    home = tmp_path / f'ros_home_{host}'
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE=discovery,
               ROS_HOME=str(home), ROS_LOG_DIR=str(home / 'log'),
               RMW_IMPLEMENTATION='rmw_fastrtps_cpp', PYTHONUNBUFFERED='1')
    env.pop('ROS_STATIC_PEERS', None)
    if peers:
        env['ROS_STATIC_PEERS'] = peers
    return env


class FileWrites:
    """Wakes when a file is written: Linux inotify (IN_MODIFY) through libc."""

    IN_MODIFY = 0x2

    def __init__(self, path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), 'inotify_init1 failed')
        if libc.inotify_add_watch(self.fd, os.fsencode(str(path)), self.IN_MODIFY) < 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, f'inotify_add_watch {path}: {os.strerror(err)}')

    def wait(self, timeout: float) -> None:
        """Until the file is written (or was since the last wait), at most ``timeout`` s."""
        if select.select([self.fd], [], [], max(0.0, timeout))[0]:
            try:
                os.read(self.fd, 65536)  # drain the queued events
            except BlockingIOError:
                pass

    def close(self) -> None:
        os.close(self.fd)


def wait_for_line(path, predicate, timeout: float, start: int = 0, what: str = ''):
    """The first line of the growing file ``path`` (from character ``start``) that satisfies
    ``predicate``, re-read each time the file is written; on timeout the test fails."""
    deadline = time.monotonic() + timeout
    writes = FileWrites(path)  # watching before the first read: no write is missed
    try:
        while True:
            text = open(path).read()[start:]
            for line in text.splitlines():
                if predicate(line):
                    return line
            if time.monotonic() > deadline:
                pytest.fail(f'no line of {path} {what or "matched"} within {timeout:g} s; '
                            f'its end:\n{text[-3000:]}')
            writes.wait(deadline - time.monotonic())
    finally:
        writes.close()
