"""The control loop's CDR readers and writers against rclpy's own serialisation: every writer's
bytes deserialise to the message meant, every reader gives what rclpy reads from random
messages (alignment moved by names and frame ids of every length), and bytes that are not the
message (truncated, garbage, huge counts, other encodings) raise WireError, nothing else."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension

from claw_rl_ros.core.wire_format import (ClockWriter, Float64ArrayWriter,
                                          ForeignEncoding, ImuWriter, JointStateReader,
                                          JointStateWriter, read_float64_array,
                                          read_imu, WireError)
from claw_rl_ros.nodes.ros_io import to_sec, to_stamp
from claw_rl_ros.nodes.wire_io import command_data, StateDecoder

HOSTILE = [math.nan, math.inf, -math.inf, 1e39, -1e308, 5e-324, -0.0]


def random_names(rng, n):
    alphabet = list('abcxyz_0123') + ['é', '脚']
    return [''.join(rng.choice(alphabet, size=int(rng.integers(0, 12)))) for _ in range(n)]


def random_values(rng, n):
    v = rng.normal(0.0, 3.0, n)
    v[rng.random(n) < 0.2] = rng.choice(HOSTILE)
    return [float(x) for x in v]


def random_joint_state(rng) -> JointState:
    n = int(rng.integers(0, 14))
    js = JointState(name=random_names(rng, n))
    js.header.frame_id = ''.join(rng.choice(list('base_link'), size=int(rng.integers(0, 9))))
    js.header.stamp = to_stamp(float(rng.uniform(0.0, 2e9)))
    # Lengths may differ from the names' (the controller refuses those, the reader does not).
    js.position = random_values(rng, n if rng.random() < 0.7 else int(rng.integers(0, 14)))
    js.velocity = random_values(rng, n if rng.random() < 0.7 else int(rng.integers(0, 14)))
    js.effort = random_values(rng, int(rng.integers(0, 14)))
    return js


def test_joint_state_reader_reads_what_rclpy_serialised():
    rng, reader = np.random.default_rng(0), JointStateReader()
    for _ in range(300):
        js = random_joint_state(rng)
        stamp, names, pos, vel, eff = reader.read(serialize_message(js))
        assert stamp == to_sec(js.header.stamp)
        assert names == tuple(js.name)
        for got, want in ((pos, js.position), (vel, js.velocity), (eff, js.effort)):
            np.testing.assert_array_equal(got, np.asarray(want, float))


def test_joint_state_reader_notices_new_names_after_a_steady_run():
    reader = JointStateReader()
    a = JointState(name=['hip', 'knee'], position=[1.0, 2.0], velocity=[0.0, 0.0])
    for _ in range(3):
        assert reader.read(serialize_message(a))[1] == ('hip', 'knee')
    # Same lengths, other names and frame id: the cached names must not be served.
    for names, frame in ((['hip', 'kne2'], ''), (['hip', 'knee'], 'x'), (['knee', 'hip'], '')):
        b = JointState(name=names, position=[3.0, 4.0], velocity=[0.0, 0.0])
        b.header.frame_id = frame
        _, got, pos, _, _ = reader.read(serialize_message(b))
        assert got == tuple(names) and pos.tolist() == [3.0, 4.0]
    assert reader.read(serialize_message(a))[1] == ('hip', 'knee')


def test_imu_and_command_readers_read_what_rclpy_serialised():
    rng = np.random.default_rng(1)
    for _ in range(200):
        imu = Imu()
        imu.header.frame_id = 'x' * int(rng.integers(0, 11))  # every alignment of the doubles
        imu.header.stamp = to_stamp(float(rng.uniform(0.0, 1e9)))
        q, w = random_values(rng, 4), random_values(rng, 3)
        imu.orientation.x, imu.orientation.y, imu.orientation.z, imu.orientation.w = q
        imu.angular_velocity.x, imu.angular_velocity.y, imu.angular_velocity.z = w
        imu.linear_acceleration.x = 9.81
        imu.orientation_covariance[0] = imu.angular_velocity_covariance[8] = -1.0
        stamp, quat, gyro = read_imu(serialize_message(imu))
        assert stamp == to_sec(imu.header.stamp)
        np.testing.assert_array_equal(quat, q)
        np.testing.assert_array_equal(gyro, w)
        cmd = Float64MultiArray(data=random_values(rng, int(rng.integers(0, 20))))
        cmd.layout.data_offset = int(rng.integers(0, 5))
        cmd.layout.dim = [MultiArrayDimension(label='j' * int(rng.integers(0, 7)), size=k,
                                              stride=3) for k in range(int(rng.integers(0, 3)))]
        np.testing.assert_array_equal(read_float64_array(serialize_message(cmd)),
                                      np.asarray(cmd.data, float))


def test_writers_send_bytes_rclpy_reads_as_the_message_meant():
    names = ['FL_hip', 'FL_thigh', 'é']
    js = JointStateWriter(names, frame_id='base')
    for stamp in (0.0, 12.34, 1_733_000_000.123456789, 7.9999999996):
        js.set_stamp(stamp)
        js.fill(np.array([1.0, -2.0, 3.5]), np.array([0.1, 0.2, math.nan]),
                np.array([-1.0, 0.0, 1e300]))
        m = deserialize_message(js.payload(), JointState)
        ns = int(round(stamp * 1e9))
        assert (m.header.stamp.sec, m.header.stamp.nanosec) == divmod(ns, 1_000_000_000)
        assert m.name == names and m.header.frame_id == 'base'
        assert list(m.position) == [1.0, -2.0, 3.5] and list(m.effort) == [-1.0, 0.0, 1e300]
        assert m.velocity[:2].tolist() == [0.1, 0.2] and math.isnan(m.velocity[2])
    for frame in ('', 'b', 'imu_link', 'abcdefg'):  # the doubles' alignment moves
        imu = ImuWriter(frame)
        imu.set_stamp(5.5)
        imu.fill(np.array([0.9, 0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0]),
                 np.array([4.0, 5.0, 6.0]))
        m = deserialize_message(imu.payload(), Imu)
        assert m.header.frame_id == frame and to_sec(m.header.stamp) == 5.5
        o, w, a = m.orientation, m.angular_velocity, m.linear_acceleration
        assert [o.x, o.y, o.z, o.w] == [0.1, 0.2, 0.3, 0.9]  # (w first in, last out)
        assert [w.x, w.y, w.z] == [1.0, 2.0, 3.0] and [a.x, a.y, a.z] == [4.0, 5.0, 6.0]
        assert not any(m.orientation_covariance) and not any(m.linear_acceleration_covariance)
    cmd = Float64ArrayWriter(12)
    cmd.data[:] = np.arange(12.0) - 5.5
    m = deserialize_message(cmd.payload(), Float64MultiArray)
    assert list(m.data) == (np.arange(12.0) - 5.5).tolist() and not m.layout.dim
    clock = ClockWriter()
    clock.set_stamp(3.02)
    assert deserialize_message(clock.payload(), Clock).clock.nanosec == 20_000_000
    assert serialize_message(Clock(clock=to_stamp(3.02)))[4:] == clock.payload()[4:]


def test_the_bytes_a_payload_hands_out_do_not_change_with_the_next_fill():
    cmd = Float64ArrayWriter(2)
    cmd.data[:] = [1.0, 2.0]
    first = cmd.payload()
    cmd.data[:] = [3.0, 4.0]
    assert read_float64_array(first).tolist() == [1.0, 2.0]
    assert read_float64_array(cmd.payload()).tolist() == [3.0, 4.0]


def valid_messages():
    js = JointState(name=['a', 'bc', 'def'], position=[1.0, 2.0, 3.0],
                    velocity=[0.0, 0.0, 0.0], effort=[1.0])
    js.header.frame_id = 'f'
    imu = Imu()
    imu.header.frame_id = 'imu'
    cmd = Float64MultiArray(data=[1.0] * 12)
    cmd.layout.dim = [MultiArrayDimension(label='joints', size=12, stride=12)]
    return [(JointStateReader().read, serialize_message(js)), (read_imu, serialize_message(imu)),
            (read_float64_array, serialize_message(cmd))]


@pytest.mark.parametrize('read,data', valid_messages(), ids=['joint_states', 'imu', 'command'])
def test_every_truncation_is_a_wire_error(read, data):
    full = len(data)
    # The shortest prefix that still reads (rmw pads the end: trailing bytes are not read).
    needed = next(n for n in range(full + 1) if _reads(read, data[:n]))
    assert needed > 8
    for n in range(needed):
        with pytest.raises(WireError):
            read(data[:n])


def _reads(read, data) -> bool:
    try:
        read(data)
    except WireError:
        return False
    return True


@pytest.mark.parametrize('read,data', valid_messages(), ids=['joint_states', 'imu', 'command'])
def test_garbage_is_a_wire_error_or_a_message_never_another_exception(read, data):
    rng = np.random.default_rng(2)
    errors = reads = 0
    for _ in range(3000):
        buf = bytearray(data)
        kind = rng.integers(0, 3)
        if kind == 0:  # flipped bytes after the header
            for i in rng.integers(4, len(buf), size=int(rng.integers(1, 6))):
                buf[i] = int(rng.integers(0, 256))
        elif kind == 1:  # random bytes under a plain CDR header
            buf = bytearray(b'\x00\x01\x00\x00' + rng.bytes(int(rng.integers(0, 200))))
        else:  # a count or length set huge
            i = 4 + 4 * int(rng.integers(0, (len(buf) - 4) // 4))
            buf[i:i + 4] = (0xFFFFFFF0 + int(rng.integers(0, 16))).to_bytes(4, 'little')
        try:
            read(bytes(buf))
            reads += 1
        except WireError:
            errors += 1
    assert errors > 500 and reads > 50, (errors, reads)


def test_another_encoding_goes_to_rclpy_and_garbage_in_it_is_still_a_wire_error():
    js = JointState(name=['a'], position=[2.0], velocity=[3.0])
    js.header.stamp = to_stamp(4.5)
    data = serialize_message(js)
    big_endian = b'\x00\x00' + data[2:]  # what a big-endian host announces
    with pytest.raises(ForeignEncoding):
        JointStateReader().read(big_endian)
    decoder = StateDecoder()
    assert decoder.joint_state(data)[:2] == (4.5, ('a',))
    with pytest.raises(WireError, match='joint_states'):
        decoder.joint_state(big_endian)  # its numbers are not big endian: rclpy refuses too
    for foreign in (b'\x00\x07\x00\x00' + bytes(3), b'\x01', b''):
        with pytest.raises(WireError):
            decoder.joint_state(foreign)
        with pytest.raises(WireError):
            decoder.imu(foreign)
        with pytest.raises(WireError):
            command_data(foreign)


def test_a_string_without_its_nul_is_a_wire_error():
    js = JointState(name=['hip'], position=[1.0], velocity=[1.0])
    js.header.frame_id = 'abc'
    data = bytearray(serialize_message(js))
    assert data[16:20] == b'abc\x00'  # frame_id: its length (4) at 12, then its bytes
    JointStateReader().read(bytes(data))
    data[19] = ord('x')
    with pytest.raises(WireError, match='NUL'):
        JointStateReader().read(bytes(data))
