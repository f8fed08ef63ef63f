"""MCAP recordings of the deploy loop, as ``ros2 bag`` (rosbag2's MCAP storage) writes them.

Layout (what rosbag2 and Foxglove read): header profile ``ros2``; one schema per message type,
named ``pkg/msg/Type`` with encoding ``ros2msg`` and, as data, the type's complete definition:
its own ``.msg`` text, then every type it uses, each after a line of 80 ``=`` and ``MSG:
pkg/msg/Type`` (rosbag2 docs/message_definition_encoding.md); channels with message encoding
``cdr`` carrying the serialised bytes exactly as DDS delivered them (encapsulation header
included), ``log_time`` = reception and ``publish_time`` = the publisher's source timestamp
[ns, system clock]. A ``claw_rl`` metadata record names the robot and command joint order.

The ``.msg`` files come from the installed interface packages (``share/<pkg>/msg``: the ament
prefixes, else the prefix the package's Python module is installed under). The file is
written as ``<path>.part`` and renamed on :meth:`Recorder.close`, so ``<path>`` is always a
complete recording. Plain Python (mcap, mcap-ros2-support): no rclpy.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
import re
from typing import Any, Iterator

from mcap.reader import make_reader
from mcap.writer import CompressionType, Writer
from mcap_ros2.decoder import DecoderFactory

SEPARATOR = '=' * 80
PRIMITIVES = {'bool', 'byte', 'char', 'float32', 'float64', 'int8', 'uint8', 'int16', 'uint16',
              'int32', 'uint32', 'int64', 'uint64', 'string', 'wstring'}
_BOUNDS = re.compile(r'(<=\d+)?(\[[^\]]*\])?$')


class DefinitionNotFound(RuntimeError):
    """A message type's .msg file is not installed where ROS keeps interface files."""


def _prefixes(package: str) -> list[Path]:
    """Install prefixes that may hold share/<package>: ament's, then the module's own."""
    out = [Path(p) for p in os.environ.get('AMENT_PREFIX_PATH', '').split(os.pathsep) if p]
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.origin:
        out += list(Path(spec.origin).resolve().parents)
    return out


def msg_file(type_name: str) -> Path:
    """The .msg file of ``pkg/msg/Type`` (or ``pkg/Type``)."""
    package, _, name = type_name.replace('/msg/', '/').partition('/')
    for prefix in _prefixes(package):
        path = prefix / 'share' / package / 'msg' / f'{name}.msg'
        if path.is_file():
            return path
    raise DefinitionNotFound(f'{type_name}: no share/{package}/msg/{name}.msg under '
                             f'AMENT_PREFIX_PATH or the install prefix of the {package} module; '
                             f'install ros-{package.replace("_", "-")} (its wheel ships it)')


def _dependencies(package: str, text: str) -> list[str]:
    """``pkg/msg/Type`` of every non-primitive field type in a .msg text, in order."""
    out = []
    for line in text.splitlines():
        tokens = line.split('#', 1)[0].split()
        if len(tokens) < 2 or '=' in tokens[1] or tokens[2:3] and tokens[2].startswith('='):
            continue  # blank, a comment, or a constant (TYPE NAME=value)
        # Strip array ([], [N], [<=N]) and bounded string (<=N) suffixes from the type.
        base = _BOUNDS.sub('', tokens[0])
        if base in PRIMITIVES:
            continue
        if base == 'Header':
            base = 'std_msgs/Header'  # the one implicit package (ROS 1 heritage)
        pkg, _, name = base.rpartition('/')
        full = f'{(pkg or package).split("/")[0]}/msg/{name}'
        if full not in out:
            out.append(full)
    return out


def message_definition(type_name: str) -> str:
    """The complete ``ros2msg`` definition of ``pkg/msg/Type``: its .msg text, then each type
    it uses (recursively, each once) after the two-line delimiter."""
    top = type_name if '/msg/' in type_name else type_name.replace('/', '/msg/', 1)
    parts, seen, todo = [], {top}, [top]
    while todo:
        current = todo.pop(0)
        text = msg_file(current).read_text()
        parts.append(text.rstrip('\n') if current == top else
                     f'{SEPARATOR}\nMSG: {current}\n{text.rstrip(chr(10))}')
        for dep in _dependencies(current.split('/')[0], text):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return '\n'.join(parts) + '\n'


class Recorder:
    """An MCAP file being written: ``add_topic`` once per topic, then ``write`` its messages."""

    def __init__(self, path: str | Path, metadata: dict[str, str] | None = None,
                 library: str = 'claw_rl_ros recorder_node'):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.part = self.path.with_name(self.path.name + '.part')
        self._file = open(self.part, 'wb')
        self._writer = Writer(self._file, compression=CompressionType.ZSTD)
        self._writer.start(profile='ros2', library=library)
        if metadata:
            self._writer.add_metadata('claw_rl', {k: str(v) for k, v in metadata.items()})
        self._schemas: dict[str, int] = {}
        self._sequence: dict[int, int] = {}
        self.counts: dict[str, int] = {}
        self.bytes = 0
        self.closed = False

    def add_topic(self, topic: str, type_name: str) -> int:
        """Register ``topic`` of type ``pkg/msg/Type``; returns its channel id."""
        if type_name not in self._schemas:
            data = message_definition(type_name).encode()
            self._schemas[type_name] = self._writer.register_schema(type_name, 'ros2msg', data)
        channel = self._writer.register_channel(topic, 'cdr', self._schemas[type_name], {})
        self._sequence[channel] = 0
        self.counts[topic] = 0
        return channel

    def write(self, channel: int, topic: str, data: bytes, log_time_ns: int,
              publish_time_ns: int) -> None:
        """One CDR-serialised message of ``channel`` (times in ns since the epoch)."""
        self._sequence[channel] += 1
        self._writer.add_message(channel, log_time=log_time_ns, data=data,
                                 publish_time=publish_time_ns,
                                 sequence=self._sequence[channel])
        self.counts[topic] += 1
        self.bytes += len(data)

    def close(self) -> Path:
        """Finish the file (summary, index) and move it to ``path``."""
        if not self.closed:
            self.closed = True
            self._writer.finish()
            self._file.close()
            os.replace(self.part, self.path)
        return self.path


def read_messages(path: str | Path) -> Iterator[tuple[str, int, int, Any]]:
    """(topic, log_time_ns, publish_time_ns, decoded message) in file order (by log time)."""
    with open(path, 'rb') as f:
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        for _, channel, message, decoded in reader.iter_decoded_messages(log_time_order=True):
            yield channel.topic, message.log_time, message.publish_time, decoded


def read_metadata(path: str | Path) -> dict[str, str]:
    """The ``claw_rl`` metadata record ({} when absent)."""
    with open(path, 'rb') as f:
        for record in make_reader(f).iter_metadata():
            if record.name == 'claw_rl':
                return dict(record.metadata)
    return {}
