"""Rollout-chunk transport: UInt8MultiArray with the versioned header vs Float32MultiArray with
labelled layout dims, for one 256 worlds x 24 steps chunk of the claw quadruped, side by side.

Each path is timed end to end as the trainer and actors run it: actor side = build the payload
+ the ROS message + rclpy serialisation; trainer side = deserialisation + decode + validation
(NaN/inf over every float, sizes). Prints medians and the ratios.

    .venv/bin/python bench/chunk_codec.py [--repeats 30] [--worlds 256] [--steps 24]
"""

import argparse
import array
import statistics
import time

import numpy as np
from rclpy.serialization import deserialize_message, serialize_message
from std_msgs.msg import Float32MultiArray, MultiArrayDimension, MultiArrayLayout, \
    UInt8MultiArray

from claw_rl_ros.core.learning.rollout_chunk import (_arrays, _header, ChunkSpec, decode_chunk,
                                                     encode_chunk, RolloutChunk)
from claw_rl_ros.core.sim.robot import load_robot


def make_chunk(t: int, n: int) -> RolloutChunk:
    robot = load_robot('claw_quadruped')
    dims = {'policy': robot.policy_obs.dim, 'policy_noise_free': robot.policy_obs.dim,
            'privileged': robot.privileged_obs.dim}
    a = robot.num_joints
    rng = np.random.default_rng(0)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    truncated = rng.random((t, n)) < 0.01
    k = int(truncated.sum())
    return RolloutChunk(
        model_sha='0123456789ab', policy_version=3, actor_id='/host1/actor_0', seq=1,
        obs={g: r(t, n, d) for g, d in dims.items()}, actions=r(t, n, a), mu=r(t, n, a),
        sigma=np.full((t, n, a), 0.5, np.float32), log_probs=r(t, n), values=r(t, n),
        rewards=r(t, n), terminated=rng.random((t, n)) < 0.01, truncated=truncated,
        final_obs={g: r(k, d) for g, d in dims.items()}, final_values=r(k),
        last_obs={g: r(n, d) for g, d in dims.items()},
        episodes={'return': r(20), 'length_s': r(20), 'reward/tracking_lin_vel': r(20)},
        stats={'diverged': 0.0})


def uint8_send(chunk: RolloutChunk) -> bytes:
    payload = encode_chunk(chunk)
    return serialize_message(UInt8MultiArray(data=array.array('B', payload)))


def uint8_receive(wire: bytes, spec: ChunkSpec) -> RolloutChunk:
    return decode_chunk(deserialize_message(wire, UInt8MultiArray).data, spec)


def float32_send(chunk: RolloutChunk) -> bytes:
    # Metadata rides in the first dimension's label; one labelled dim per field.
    header = _header(chunk)
    arrays = _arrays(chunk)
    fields = [(name, shape) for name, shape in header['fields']]
    flat = np.concatenate([np.asarray(arrays[name], np.float32).ravel() for name, _ in fields])
    dims = [MultiArrayDimension(label=f'meta:{chunk.model_sha}:{chunk.policy_version}:'
                                f'{chunk.actor_id}', size=0, stride=0)]
    dims += [MultiArrayDimension(label=f'{name}:{"x".join(map(str, shape))}',
                                 size=int(np.prod(shape)), stride=0) for name, shape in fields]
    msg = Float32MultiArray(layout=MultiArrayLayout(dim=dims, data_offset=0),
                            data=array.array('f', flat.tobytes()))
    return serialize_message(msg)


def float32_receive(wire: bytes) -> dict[str, np.ndarray]:
    msg = deserialize_message(wire, Float32MultiArray)
    body = np.frombuffer(msg.data, np.float32)
    if not np.isfinite(body).all():
        raise ValueError('non-finite')
    out, pos = {}, 0
    for dim in msg.layout.dim[1:]:
        name, shape = dim.label.split(':')
        out[name] = body[pos:pos + dim.size].reshape([int(s) for s in shape.split('x')])
        pos += dim.size
    return out


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--repeats', type=int, default=30)
    parser.add_argument('--worlds', type=int, default=256)
    parser.add_argument('--steps', type=int, default=24)
    args = parser.parse_args()
    chunk = make_chunk(args.steps, args.worlds)
    spec = ChunkSpec(args.steps, chunk.obs_dims, chunk.num_actions)
    u8_wire, f32_wire = uint8_send(chunk), float32_send(chunk)
    steps = args.steps * args.worlds
    rows = {
        'encode (payload only)': (median_ms(lambda: encode_chunk(chunk), args.repeats), None),
        'actor side (payload+msg+serialise)': (
            median_ms(lambda: uint8_send(chunk), args.repeats),
            median_ms(lambda: float32_send(chunk), args.repeats)),
        'trainer side (deserialise+decode+checks)': (
            median_ms(lambda: uint8_receive(u8_wire, spec), args.repeats),
            median_ms(lambda: float32_receive(f32_wire), args.repeats)),
    }
    print(f'chunk: {args.worlds} worlds x {args.steps} steps = {steps} env steps; '
          f'UInt8 wire {len(u8_wire) / 1e6:.2f} MB, Float32 wire {len(f32_wire) / 1e6:.2f} MB')
    print(f'{"median ms":42s} {"UInt8+header":>13s} {"Float32+dims":>13s} {"f32/u8":>7s}')
    for name, (u8, f32) in rows.items():
        tail = f'{f32:13.2f} {f32 / u8:7.2f}' if f32 is not None else ''
        print(f'{name:42s} {u8:13.2f} {tail}')
    decode_ms = rows['trainer side (deserialise+decode+checks)'][0]
    print(f'trainer decode capacity (UInt8): {steps / decode_ms * 1e3:,.0f} env steps/s '
          f'on one core')


if __name__ == '__main__':
    main()
