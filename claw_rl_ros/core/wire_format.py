"""The control loop's messages as the bytes DDS carries them (CDR), read and written directly.

A lockstep control step moves four messages (``/clock``, ``imu``, ``joint_states``,
``joint_commands``). Through rclpy each is converted between a Python object, a C struct and
its CDR bytes on both sides: ~45 us of a ~0.4 ms step (bench/ros_control.py). The nodes
instead publish bytes refilled in place (:class:`JointStateWriter`, :class:`ImuWriter`,
:class:`Float64ArrayWriter`, :class:`ClockWriter`) and subscribe raw, reading only the fields
they use into numpy views (:func:`read_imu`, :class:`JointStateReader`,
:func:`read_float64_array`).

The format is plain CDR (XCDR1) little endian, what rmw_fastrtps and rmw_cyclonedds send on
x86: a 4-byte encapsulation header (``00 01`` + 2 option bytes), then the fields in order,
each primitive aligned to its size (doubles to 8) counted from the end of the header; a string
is a uint32 length including its NUL, the bytes and the NUL; a sequence a uint32 count and its
elements. Padding bytes may hold anything (rmw leaves them uninitialised).

Reading judges the bytes by their worst case: a count or length past the end, a string
without its NUL or not UTF-8, a header too short raise :class:`WireError` (the caller drops
and counts the message); another encapsulation (big endian, XCDR2) raises
:class:`ForeignEncoding`, a :class:`WireError` the caller may hand to rclpy's own
deserialisation instead. Trailing bytes are ignored, as rmw does. No ROS imports:
test_wire_format.py checks every reader and writer against rclpy's serialisation.
"""

from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

# Encapsulation: plain CDR, little endian (the options bytes that follow are not read).
CDR_LE = b'\x00\x01'
HEADER = 4  # encapsulation bytes before the payload; alignment counts from here
_U32 = struct.Struct('<I')
_STAMP = struct.Struct('<iI')  # builtin_interfaces/Time: int32 sec, uint32 nanosec
# sensor_msgs/Imu after its header: orientation (x, y, z, w), its covariance [9], angular
# velocity (x, y, z), its covariance [9], linear acceleration (x, y, z), its covariance [9].
IMU_DOUBLES = 37
IMU_GYRO = slice(13, 16)
IMU_ACC = slice(25, 28)


class WireError(ValueError):
    """Bytes that are not a well-formed message of the expected type."""


class ForeignEncoding(WireError):
    """Bytes in another encoding than plain little-endian CDR (big endian, XCDR2): maybe a
    well-formed message, for rclpy's deserialisation to judge."""


def _align(offset: int, size: int) -> int:
    """``offset`` (into the buffer) moved up to a multiple of ``size`` past the header."""
    return offset + (-(offset - HEADER)) % size


def _check_header(buf: bytes, name: str) -> None:
    if len(buf) < HEADER:
        raise WireError(f'{name}: {len(buf)} bytes, shorter than the CDR header')
    if buf[:2] != CDR_LE:
        raise ForeignEncoding(f'{name}: encapsulation {buf[:2].hex()} is not plain CDR little '
                              'endian (0001)')


def _u32(buf: bytes, offset: int, name: str) -> tuple[int, int]:
    """(value, offset after it) of the aligned uint32 at ``offset``."""
    offset = _align(offset, 4)
    if offset + 4 > len(buf):
        raise WireError(f'{name}: message ends at byte {len(buf)}, inside a count')
    return _U32.unpack_from(buf, offset)[0], offset + 4


def _string(buf: bytes, offset: int, name: str) -> tuple[str, int]:
    """(text, offset after it) of the CDR string at ``offset``."""
    size, offset = _u32(buf, offset, name)
    if size == 0:  # (some writers send an empty string without its NUL)
        return '', offset
    end = offset + size
    if end > len(buf):
        raise WireError(f'{name}: a string of {size} bytes runs past the message end '
                        f'({len(buf)} bytes)')
    if buf[end - 1] != 0:
        raise WireError(f'{name}: a string without its terminating NUL')
    try:
        return buf[offset:end - 1].decode('utf-8'), end
    except UnicodeDecodeError as exc:
        raise WireError(f'{name}: a string that is not UTF-8 ({exc.reason})') from None


def _doubles(buf: bytes, offset: int, name: str) -> tuple[np.ndarray, int]:
    """([n] float64 view into ``buf``, offset after it) of the float64 sequence at ``offset``."""
    count, offset = _u32(buf, offset, name)
    if count == 0:
        return np.zeros(0), offset
    offset = _align(offset, 8)
    end = offset + 8 * count
    if end > len(buf):
        raise WireError(f'{name}: {count} doubles run past the message end ({len(buf)} bytes)')
    return np.frombuffer(buf, '<f8', count, offset), end


def header_stamp(buf: bytes, name: str = 'message') -> float:
    """The header stamp [s] of a message that starts with a std_msgs/Header."""
    if len(buf) < HEADER + _STAMP.size:
        raise WireError(f'{name}: {len(buf)} bytes, too short for a header stamp')
    sec, nanosec = _STAMP.unpack_from(buf, HEADER)
    return sec + nanosec * 1e-9


class JointStateReader:
    """sensor_msgs/JointState bytes -> (stamp [s], names, [n] position, [n] velocity, [n]
    effort); the arrays are read-only views into the bytes.

    The frame id and names are parsed once and kept: a later message whose bytes from the
    frame id to the end of the names are the same reuses them (equal bytes parse equally), so
    a steady publisher costs one comparison instead of a string parse per joint.
    """

    def __init__(self):
        self._region: bytes | None = None  # bytes of frame id + names, last parsed
        self._names: tuple[str, ...] = ()

    def read(self, buf: bytes
             ) -> tuple[float, tuple[str, ...], np.ndarray, np.ndarray, np.ndarray]:
        _check_header(buf, 'joint_states')
        stamp = header_stamp(buf, 'joint_states')
        start = HEADER + _STAMP.size
        region = self._region
        if region is not None and buf[start:start + len(region)] == region:
            names, offset = self._names, start + len(region)
        else:
            _, offset = _string(buf, start, 'joint_states frame_id')
            count, offset = _u32(buf, offset, 'joint_states name')
            if count > len(buf):  # each name takes at least 4 bytes
                raise WireError(f'joint_states name: {count} names in {len(buf)} bytes')
            out = []
            for _ in range(count):
                text, offset = _string(buf, offset, 'joint_states name')
                out.append(text)
            names = tuple(out)
            self._region, self._names = bytes(buf[start:offset]), names
        position, offset = _doubles(buf, offset, 'joint_states position')
        velocity, offset = _doubles(buf, offset, 'joint_states velocity')
        effort, _ = _doubles(buf, offset, 'joint_states effort')
        return stamp, names, position, velocity, effort


def read_imu(buf: bytes) -> tuple[float, np.ndarray, np.ndarray]:
    """sensor_msgs/Imu bytes -> (stamp [s], [4] orientation x y z w, [3] angular velocity)."""
    _check_header(buf, 'imu')
    stamp = header_stamp(buf, 'imu')
    _, offset = _string(buf, HEADER + _STAMP.size, 'imu frame_id')
    offset = _align(offset, 8)
    if offset + 8 * IMU_DOUBLES > len(buf):
        raise WireError(f'imu: message ends at byte {len(buf)}, before its last field')
    values = np.frombuffer(buf, '<f8', IMU_DOUBLES, offset)
    return stamp, values[:4].copy(), values[IMU_GYRO].copy()  # (kept past the bytes' life)


def read_float64_array(buf: bytes) -> np.ndarray:
    """std_msgs/Float64MultiArray bytes -> its [n] data (the layout is skipped, as the nodes
    read commands by position)."""
    _check_header(buf, 'joint_commands')
    dims, offset = _u32(buf, HEADER, 'joint_commands layout')
    if dims > len(buf):  # each dimension takes at least 12 bytes
        raise WireError(f'joint_commands layout: {dims} dimensions in {len(buf)} bytes')
    for _ in range(dims):
        _, offset = _string(buf, offset, 'joint_commands layout label')
        _, offset = _u32(buf, offset, 'joint_commands layout size')
        _, offset = _u32(buf, offset, 'joint_commands layout stride')
    _, offset = _u32(buf, offset, 'joint_commands data_offset')
    return _doubles(buf, offset, 'joint_commands data')[0]


class _Encoder:
    """Appends aligned CDR fields to a message being built and remembers where they went."""

    def __init__(self):
        self.buf = bytearray(CDR_LE + b'\x00\x00')

    def pad(self, size: int) -> None:
        self.buf += bytes(_align(len(self.buf), size) - len(self.buf))

    def u32(self, value: int) -> None:
        self.pad(4)
        self.buf += _U32.pack(value)

    def stamp(self) -> int:
        """A zero Time; returns its offset."""
        self.pad(4)
        offset = len(self.buf)
        self.buf += bytes(_STAMP.size)
        return offset

    def string(self, text: str) -> None:
        data = text.encode('utf-8') + b'\x00'
        self.u32(len(data))
        self.buf += data

    def doubles(self, count: int, sequence: bool = True) -> int:
        """``count`` zero doubles (a sequence: with its count); returns their offset."""
        if sequence:
            self.u32(count)
        self.pad(8)
        offset = len(self.buf)
        self.buf += bytes(8 * count)
        return offset


class _Writer:
    """A message's bytes, refilled in place: ``stamp_at`` and float64 views set up by a
    subclass; :meth:`payload` is what a raw publisher sends."""

    def __init__(self, encoder: _Encoder, stamp_at: int | None):
        self._buf = encoder.buf
        self._stamp_at = stamp_at

    def _view(self, offset: int, count: int) -> np.ndarray:
        return np.frombuffer(self._buf, '<f8', count, offset)

    def set_stamp(self, seconds: float) -> None:
        """Write the header stamp ``seconds`` [s] (rounded to the nanosecond)."""
        ns = int(round(seconds * 1e9))
        _STAMP.pack_into(self._buf, self._stamp_at, ns // 1_000_000_000, ns % 1_000_000_000)

    def payload(self) -> bytes:
        return bytes(self._buf)


class JointStateWriter(_Writer):
    """sensor_msgs/JointState of fixed ``names`` (and frame id): position, velocity and effort
    are [n] views refilled each step."""

    def __init__(self, names: Sequence[str], frame_id: str = ''):
        enc = _Encoder()
        stamp_at = enc.stamp()
        enc.string(frame_id)
        enc.u32(len(names))
        for name in names:
            enc.string(name)
        n = len(names)
        at = [enc.doubles(n) for _ in range(3)]
        super().__init__(enc, stamp_at)
        self.position, self.velocity, self.effort = (self._view(a, n) for a in at)

    def fill(self, position: np.ndarray, velocity: np.ndarray, effort: np.ndarray) -> None:
        """The [n] arrays (the stamp: :meth:`set_stamp`)."""
        self.position[:], self.velocity[:], self.effort[:] = position, velocity, effort


class ImuWriter(_Writer):
    """sensor_msgs/Imu under ``frame_id``; covariances stay 0 (unknown, per REP-145 read as
    "not given")."""

    def __init__(self, frame_id: str = ''):
        enc = _Encoder()
        stamp_at = enc.stamp()
        enc.string(frame_id)
        values = enc.doubles(IMU_DOUBLES, sequence=False)
        super().__init__(enc, stamp_at)
        self._values = self._view(values, IMU_DOUBLES)

    def fill(self, orientation_wxyz: np.ndarray, gyro: np.ndarray, acc: np.ndarray) -> None:
        """``orientation_wxyz`` as MuJoCo gives quaternions (w first; the message is x y z w);
        the stamp: :meth:`set_stamp`."""
        v = self._values
        v[:3], v[3] = orientation_wxyz[1:], orientation_wxyz[0]
        v[IMU_GYRO], v[IMU_ACC] = gyro, acc


class Float64ArrayWriter(_Writer):
    """std_msgs/Float64MultiArray without layout dimensions: [n] ``data`` refilled."""

    def __init__(self, count: int):
        enc = _Encoder()
        enc.u32(0)  # layout.dim: none
        enc.u32(0)  # layout.data_offset
        at = enc.doubles(count)
        super().__init__(enc, None)
        self.data = self._view(at, count)


class ClockWriter(_Writer):
    """rosgraph_msgs/Clock (one builtin_interfaces/Time)."""

    def __init__(self):
        enc = _Encoder()
        stamp_at = enc.stamp()
        super().__init__(enc, stamp_at)
