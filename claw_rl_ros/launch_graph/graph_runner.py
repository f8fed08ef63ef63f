"""Run a resolved graph as real processes: ``claw-rl up`` without ROS launch installed.

Each node runs as ``python -m <module> <args> --ros-args ...`` (the command line launch_ros
gives the installed executable, see :func:`.description.ros_command`) in its own process group,
with stdout and stderr merged and printed line by line behind ``[<node>] ``. Shutdown follows
launch's sequence: SIGINT to every node, SIGTERM to those alive after ``grace_s``, SIGKILL after
another ``grace_s``. It starts on Ctrl-C or SIGTERM to the runner (a second one skips the
wait), or when a node exits on its own: a node that dies stops the graph, and the runner exits
non-zero. A one-shot node (``exits``, e.g. ``claw_rl stand``, a trainer at its budget) that
finishes with status 0 is not a failure: it ends the graph cleanly (ros2 launch's
``on_exit=Shutdown``) and the runner exits 0. A ``respawn`` node (the deploy graph's policy
node) that dies abnormally (non-zero status or a signal) is started again after its
``respawn_delay``, logged, unless the graph is shutting down by then; after
:data:`RESPAWN_GIVE_UP` restarts in a row that each died within :data:`RESPAWN_MIN_UPTIME_S`
of starting (a node refusing its configuration: restarting does not help) the graph stops.
"""

from __future__ import annotations

from dataclasses import dataclass
import os
from pathlib import Path
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Mapping, Sequence

from .description import inline_params_yaml, ResolvedNode, ros_command

# Exit statuses that mean "stopped cleanly because we sent SIGINT" (rclpy nodes return 0; a
# CLI that catches KeyboardInterrupt returns 130; a default handler dies by the signal).
CLEAN_ON_SIGINT = (0, 130, -signal.SIGINT)
POLL_S = 0.2
# A respawn node that died this soon after starting, this many times in a row, is given up.
RESPAWN_MIN_UPTIME_S = 10.0
RESPAWN_GIVE_UP = 3


def command_line(node: ResolvedNode, params_dir: Path | None,
                 python: str = sys.executable, log_level: str | None = None) -> list[str]:
    """The process to start for ``node``; writes its inline parameter file into params_dir.

    ``log_level`` (e.g. ``debug``) sets the node's own logger only (``ns.name``, as rclpy names
    it), not rcl's and rmw's, whose debug output would bury the node's.
    """
    inline = None
    if node.parameters:
        if params_dir is None:
            inline = '<inline parameters file>'
        else:
            path = params_dir / f'{node.fqn.strip("/").replace("/", "__")}.yaml'
            path.write_text(inline_params_yaml(node))
            inline = str(path)
    cmd = [python, '-m', node.module, *ros_command(node, inline)]
    if log_level:
        cmd += ['--log-level', f'{node.fqn.strip("/").replace("/", ".")}:={log_level}']
    return cmd


def exit_text(code: int) -> str:
    if code < 0:
        try:
            return f'killed by {signal.Signals(-code).name}'
        except ValueError:
            return f'killed by signal {-code}'
    return f'exit status {code}'


@dataclass
class _Child:
    node: ResolvedNode
    proc: subprocess.Popen
    reader: threading.Thread
    label: str
    started: float  # time.monotonic() at the start
    code: int | None = None


class GraphRunner:
    """Start ``nodes``, relay their output, supervise them, and stop them all on the way out.

    ``run()`` returns 0 when every node ended cleanly (one-shot nodes with status 0, or all of
    them on a requested shutdown), else 1 (or the failed node's own positive status).
    """

    def __init__(self, nodes: Sequence[ResolvedNode], *, grace_s: float = 5.0,
                 out: IO[str] | None = None, env: Mapping[str, str] | None = None,
                 python: str = sys.executable, log_level: str | None = None):
        self.nodes = list(nodes)
        self.grace_s = grace_s
        self.log_level = log_level
        self.out = out if out is not None else sys.stdout
        self.env = {**(os.environ if env is None else env), 'PYTHONUNBUFFERED': '1'}
        self.python = python
        self.children: list[_Child] = []
        self._lock = threading.Lock()
        self._signals: list[int] = []
        self._wake_r, self._wake_w = os.pipe()
        self._restarts: list[tuple[float, ResolvedNode]] = []  # (due time.monotonic(), node)
        self._quick_deaths: dict[str, int] = {}  # respawn node fqn -> early deaths in a row

    # ----------------------------------------------------------------------------- output
    def say(self, text: str) -> None:
        self.emit('up', text)

    def emit(self, label: str, line: str) -> None:
        """One prefixed line; a closed output (``| head`` ended) drops lines, never the nodes."""
        with self._lock:
            if self.out is None:
                return
            try:
                self.out.write(f'[{label}] {line.rstrip()}\n')
                self.out.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.out = None

    def _relay(self, label: str, proc: subprocess.Popen) -> None:
        for raw in iter(proc.stdout.readline, b''):
            self.emit(label, raw.decode(errors='replace'))
        proc.stdout.close()
        # The output ends as the node exits: once it has, wake the loop (off the main thread,
        # where no SIGCHLD handler can be installed, it would see the exit at its next poll).
        try:
            proc.wait(timeout=POLL_S)
            os.write(self._wake_w, b'!')
        except (OSError, subprocess.TimeoutExpired):
            pass  # run() has already ended and closed its wake-up pipe, or it lives on

    # ---------------------------------------------------------------------------- signals
    def _on_signal(self, signum, frame) -> None:
        self._signals.append(signum)  # no locks here: read by the loop after the wake-up
        os.write(self._wake_w, b'!')

    def stop(self) -> None:
        """Ask :meth:`run`, running in another thread, to stop the graph as Ctrl-C does."""
        try:
            self._on_signal(signal.SIGINT, None)
        except OSError:
            pass  # run() has already ended and closed its wake-up pipe

    def _install_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        handlers = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        handlers[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, self._on_signal)
        return handlers

    def _wait(self, timeout: float) -> None:
        """Sleep until a signal (child exit, Ctrl-C, SIGTERM) arrives or timeout passes."""
        ready, _, _ = select.select([self._wake_r], [], [], timeout)
        if ready:
            os.read(self._wake_r, 4096)

    def _user_signals(self) -> list[int]:
        taken = [s for s in self._signals if s != signal.SIGCHLD]
        self._signals.clear()
        return taken

    # -------------------------------------------------------------------------- processes
    def _start(self, node: ResolvedNode, params_dir: Path) -> None:
        cmd = command_line(node, params_dir, self.python, self.log_level)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=self.env,
                                start_new_session=True)  # only the runner forwards Ctrl-C
        label = node.fqn.lstrip('/')
        reader = threading.Thread(target=self._relay, args=(label, proc), daemon=True)
        reader.start()
        self.children.append(_Child(node, proc, reader, label, time.monotonic()))
        self.say(f'started {label} (pid {proc.pid}): {shlex.join(cmd[1:])}')

    def _reap(self) -> list[_Child]:
        """Children that ended since the last call, their output relayed to the end."""
        ended = []
        for child in self.children:
            if child.code is None and child.proc.poll() is not None:
                child.code = child.proc.returncode
                child.reader.join(timeout=2.0)
                ended.append(child)
        return ended

    def _alive(self) -> list[_Child]:
        return [c for c in self.children if c.proc.poll() is None]

    def _signal_all(self, sig: int) -> None:
        for child in self._alive():
            try:
                os.kill(child.proc.pid, sig)
            except ProcessLookupError:
                pass

    def _wait_all(self, timeout: float) -> bool:
        """Wait until every child ended; False at the timeout or on a new user signal."""
        deadline = time.monotonic() + timeout
        while self._alive():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._user_signals():
                return False
            self._wait(min(POLL_S, remaining))
        return True

    def shutdown(self) -> bool:
        """SIGINT, then SIGTERM, then SIGKILL, each after grace_s; True if SIGINT sufficed."""
        clean = True
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            alive = self._alive()
            if not alive:
                break
            if sig != signal.SIGINT:
                clean = False
                self.say(f'{", ".join(c.label for c in alive)} still running: sending '
                         f'{sig.name}')
            self._signal_all(sig)
            if self._wait_all(self.grace_s if sig != signal.SIGKILL else 10.0):
                break
        for child in self._reap():
            self.say(f'{child.label} stopped ({exit_text(child.code)})')
        return clean

    def run(self) -> int:
        """Start every node and supervise until the graph ends; the exit status."""
        handlers = self._install_handlers()
        try:
            with tempfile.TemporaryDirectory(prefix='claw_rl_up_') as tmp:
                try:
                    return self._run(Path(tmp))
                finally:
                    self.shutdown()  # whatever ended the loop, no node outlives the runner
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _run(self, params_dir: Path) -> int:
        try:
            for node in self.nodes:
                self._start(node, params_dir)
        except OSError as exc:
            self.say(f'cannot start {node.fqn}: {exc}')
            self.shutdown()
            return 1
        while True:
            if self._user_signals():
                self.say('shutting down (Ctrl-C again to skip the grace period)')
                clean = self.shutdown()
                bad = [c for c in self.children if c.code not in CLEAN_ON_SIGINT]
                return 0 if clean and not bad else 1
            for child in self._reap():
                if child.node.exits and child.code == 0:
                    self.say(f'{child.label} finished')
                    clean = self.shutdown()
                    bad = [c for c in self.children if c.code not in CLEAN_ON_SIGINT]
                    return 0 if clean and not bad else 1
                if self._respawn(child):
                    continue
                self.say(f'{child.label} died ({exit_text(child.code)}): stopping the graph')
                self.shutdown()
                return child.code if child.code > 0 else 1
            now = time.monotonic()
            for due, node in [r for r in self._restarts if r[0] <= now]:
                self._restarts.remove((due, node))
                try:
                    self._start(node, params_dir)
                except OSError as exc:
                    self.say(f'cannot restart {node.fqn}: {exc}: stopping the graph')
                    self.shutdown()
                    return 1
            if not self._alive() and not self._restarts:
                return 0
            self._wait(min([POLL_S] + [due - now for due, _ in self._restarts]))

    def _respawn(self, child: _Child) -> bool:
        """Schedule a restart of a respawn node that died abnormally; False: the graph stops."""
        node = child.node
        if not node.respawn or child.code == 0:
            return False
        early = time.monotonic() - child.started < RESPAWN_MIN_UPTIME_S
        deaths = self._quick_deaths.get(node.fqn, 0) + 1 if early else 0
        if deaths > RESPAWN_GIVE_UP:
            self.say(f'{child.label} died ({exit_text(child.code)}) within '
                     f'{RESPAWN_MIN_UPTIME_S:g} s of starting {deaths} times in a row: not '
                     'restarting it again')
            return False
        self._quick_deaths[node.fqn] = deaths
        self.children.remove(child)  # replaced: its exit is handled, not the graph's status
        self._restarts.append((time.monotonic() + node.respawn_delay, node))
        self.say(f'{child.label} died ({exit_text(child.code)}): restarting it in '
                 f'{node.respawn_delay:g} s')
        return True
