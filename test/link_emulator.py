"""A network link in user space: rate, delay and loss between two TAP devices (root only).

This kernel has no ``netem`` qdisc (``tc`` knows ``tbf`` and ``htb``: rate, no delay, no loss),
so a link with a LAN's or a Wi-Fi's delay and loss is made here: the process opens two TAP
devices (``--tap A --tap B``, created in its own namespace; move them where they belong after
``ready`` is printed: an open TAP keeps its file descriptor across namespaces) and forwards
every Ethernet frame from one to the other, per direction:

- lost with probability ``--loss`` (independently per frame, ``--seed``: reproducible);
- queued behind the frames before it at ``--rate-mbit`` (a frame of L bytes takes 8 L / rate
  to send); a frame that would wait over ``--queue-ms`` is dropped (tail drop, as ``tbf``'s
  ``latency``);
- released ``--delay-ms`` after it was sent (propagation).

The devices go when the process ends (they are not persistent). Frames carry no
``virtio_net_hdr`` (``IFF_NO_PI``, no ``IFF_VNET_HDR``), so the kernel segments before the TAP:
every frame is at most the MTU, as on a wire. Timers have the poll's millisecond resolution.

    ip netns exec NS python test/link_emulator.py --tap e0 --tap e1 --rate-mbit 20 \\
        --delay-ms 20 --loss 0.01

Prints one line of counters per direction when it gets SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
from collections import deque
import fcntl
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454ca
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000


def open_tap(name: str) -> int:
    """A new (non-persistent) TAP device ``name``; its non-blocking file descriptor."""
    fd = os.open('/dev/net/tun', os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack('16sH', name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


class Direction:
    """Frames from one TAP to the other: loss, a rate-limited queue, then the delay."""

    def __init__(self, rate_bps: float, delay_s: float, loss: float, queue_s: float,
                 rng: random.Random):
        self.rate_bps, self.delay_s, self.loss, self.queue_s = rate_bps, delay_s, loss, queue_s
        self.rng = rng
        self.free_at = 0.0  # when the link finishes sending the frames queued so far
        self.in_flight: deque[tuple[float, bytes]] = deque()  # (release time, frame), in order
        self.counts = {'frames': 0, 'bytes': 0, 'lost': 0, 'queue_drops': 0}

    def offer(self, frame: bytes, now: float) -> None:
        self.counts['frames'] += 1
        if self.loss and self.rng.random() < self.loss:
            self.counts['lost'] += 1
            return
        start = max(now, self.free_at)
        if self.rate_bps and start - now > self.queue_s:
            self.counts['queue_drops'] += 1
            return
        # Serialisation at the rate, then propagation.
        self.free_at = start + (8 * len(frame) / self.rate_bps if self.rate_bps else 0.0)
        self.in_flight.append((self.free_at + self.delay_s, frame))

    def release(self, fd: int, now: float) -> None:
        while self.in_flight and self.in_flight[0][0] <= now:
            frame = self.in_flight.popleft()[1]
            try:
                os.write(fd, frame)
                self.counts['bytes'] += len(frame)
            except OSError:  # the device went (namespace deleted) or is full: frame lost
                self.counts['queue_drops'] += 1

    def next_release(self) -> float | None:
        return self.in_flight[0][0] if self.in_flight else None


def forward(fds: tuple[int, int], directions: tuple[Direction, Direction],
            stop: list[bool]) -> None:
    """Until ``stop[0]``: frames read from ``fds[i]`` go through ``directions[i]`` to the
    other fd."""
    poll = select.poll()
    for fd in fds:
        poll.register(fd, select.POLLIN)
    while not stop[0]:
        now = time.monotonic()
        due = [t for t in (d.next_release() for d in directions) if t is not None]
        timeout_ms = max(0.0, (min(due) - now) * 1e3) if due else 200.0
        try:
            events = poll.poll(timeout_ms)  # (rounded up to whole milliseconds)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd, _ in events:
            side = fds.index(fd)
            while True:  # drain what is queued on this device
                try:
                    frame = os.read(fd, 65536)
                except BlockingIOError:
                    break
                except OSError:
                    stop[0] = True
                    break
                directions[side].offer(frame, now)
        for side, direction in enumerate(directions):
            direction.release(fds[1 - side], time.monotonic())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--tap', action='append', required=True, help='TAP name (twice)')
    parser.add_argument('--rate-mbit', type=float, default=0.0, help='0: unlimited')
    parser.add_argument('--delay-ms', type=float, default=0.0)
    parser.add_argument('--loss', type=float, default=0.0, help='frame loss probability')
    parser.add_argument('--queue-ms', type=float, default=200.0)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    if len(args.tap) != 2:
        parser.error(f'--tap must be given twice (got {args.tap})')
    if not 0.0 <= args.loss < 1.0:
        parser.error(f'--loss {args.loss} is not a probability in [0, 1)')
    fds = tuple(open_tap(name) for name in args.tap)
    rng = random.Random(args.seed)
    directions = tuple(Direction(args.rate_mbit * 1e6, args.delay_ms / 1e3, args.loss,
                                 args.queue_ms / 1e3, rng) for _ in range(2))
    stop = [False]

    def on_signal(*_):
        stop[0] = True
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print('ready', flush=True)
    forward(fds, directions, stop)
    for name, direction in zip(args.tap, directions):
        print(f'from {name}: ' + ', '.join(f'{k} {v}' for k, v in direction.counts.items()),
              flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
