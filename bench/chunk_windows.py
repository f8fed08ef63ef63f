"""A student's memory in rollout chunks: whole windows vs frames, side by side in one run.

The terrain job's actor chunk (config/train_rough.yaml: 256 worlds x 24 steps, every group
the trainer receives) collected by a real batched actor at each ``env.policy_history``; then,
in alternating rounds, the same chunk encoded with its windows whole and as frames
(:mod:`claw_rl_ros.core.live.chunk_windows`): payload bytes, encode and decode time (the actor
checks that the frames rebuild its windows; the trainer rebuilds them), and the ratios.

    .venv/bin/python bench/chunk_windows.py [--histories 10 50] [--rounds 5]
"""

import argparse
import copy
import dataclasses
import time

import numpy as np

from claw_rl_ros.core.learning.train_config import load_train_config, parse_overrides
from claw_rl_ros.core.live.batched_actor import BatchedActor
from claw_rl_ros.core.live.chunk_learner import ChunkLearner
from claw_rl_ros.core.live.rollout_chunk import decode_chunk, encode_chunk
from claw_rl_ros.core.sim.env import VecLocomotionEnv


def actor_chunk(history: int):
    """(the trainer's chunk spec, one chunk of the terrain job's actor at this window)."""
    cfg = load_train_config('config/train_rough.yaml',
                            parse_overrides([f'env.policy_history={history}']))
    env = VecLocomotionEnv(copy.deepcopy(cfg.env))
    learner = ChunkLearner(cfg, env.obs_dims, env.num_actions)
    actor = BatchedActor(env, copy.deepcopy(learner.policy), cfg.runner.num_steps_per_env)
    actor.load_policy(learner.policy.state_dict(), 0, 'bench')
    actor.collect()  # worlds past their first reset
    chunk = actor.collect()
    env.close()
    return learner.spec, chunk


def timed(fn, *args) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--histories', type=int, nargs='+', default=[10, 50])
    parser.add_argument('--rounds', type=int, default=5)
    args = parser.parse_args()
    print('terrain job actor chunk (256 worlds x 24 steps); whole windows vs frames, '
          f'{args.rounds} alternating rounds, medians')
    print(f'{"H":>3} {"whole MB":>9} {"frames MB":>10} {"size":>6} {"encode ms":>16} '
          f'{"decode ms":>16} {"encode+decode":>14}')
    for history in args.histories:
        spec, chunk = actor_chunk(history)
        variants = {'whole': dataclasses.replace(chunk, windows={}), 'frames': chunk}
        times = {key: {'encode': [], 'decode': []} for key in variants}
        sizes = {}
        for _ in range(args.rounds):
            for key, variant in variants.items():
                seconds, payload = timed(encode_chunk, variant)
                times[key]['encode'].append(seconds)
                sizes[key] = len(payload)
                seconds, decoded = timed(decode_chunk, payload, spec)
                times[key]['decode'].append(seconds)
        # The frames decode to the windows the actor acted on, bit for bit.
        assert np.array_equal(decoded.obs['policy'], chunk.obs['policy'])
        med = {key: {part: float(np.median(v)) * 1e3 for part, v in parts.items()}
               for key, parts in times.items()}
        both = {key: med[key]['encode'] + med[key]['decode'] for key in med}
        print(f'{history:>3} {sizes["whole"] / 1e6:>9.1f} {sizes["frames"] / 1e6:>10.1f} '
              f'{sizes["frames"] / sizes["whole"]:>6.2f} '
              f'{med["whole"]["encode"]:>7.1f} -> {med["frames"]["encode"]:>5.1f} '
              f'{med["whole"]["decode"]:>7.1f} -> {med["frames"]["decode"]:>5.1f} '
              f'{both["frames"] / both["whole"]:>13.2f}x')


if __name__ == '__main__':
    main()
