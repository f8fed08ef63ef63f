"""Worlds sharing randomised model copies (env.randomization.worlds_per_model)."""

import numpy as np
import pytest

from claw_rl_ros.core.config import from_dict
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.model_variants import ModelVariants, pool_size


def random_resets(variants: ModelVariants, num_envs: int, steps: int, seed: int = 0):
    """Yield (ids, copies, fresh, users before) for ``steps`` calls with random reset sets,
    the first call resetting every world (as an env's first reset does)."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        ids = np.arange(num_envs) if step == 0 else \
            np.flatnonzero(rng.random(num_envs) < rng.choice([0.02, 0.2, 1.0]))
        before = variants.users.copy()
        copies, fresh = variants.assign(ids)
        yield ids, copies, fresh, before


def test_a_copy_is_drawn_anew_only_when_no_world_steps_with_it():
    num, share = 256, 8
    variants = ModelVariants(num, share)
    assert variants.size == pool_size(num, share) == 64
    for ids, copies, fresh, before in random_resets(variants, num, 400):
        assert len(set(fresh)) == len(fresh)
        staying = np.setdiff1d(np.arange(num), ids)
        # A fresh copy was used by none of the worlds that keep their episode going.
        assert not np.isin(variants.of_world[staying], fresh).any()
        assert (copies >= 0).all() and (copies < variants.size).all()
        # Bookkeeping: users per copy are the worlds that hold it.
        np.testing.assert_array_equal(variants.users,
                                      np.bincount(variants.of_world, minlength=variants.size))
        # Resets take copies in groups of ``share`` while free copies remain.
        if len(fresh) > 1:
            assert np.bincount(copies)[fresh[:-1]].max() <= share


def test_a_small_reset_joins_the_copy_being_filled():
    variants = ModelVariants(16, 4)
    copies, fresh = variants.assign(np.arange(16))
    np.testing.assert_array_equal(copies, np.repeat(np.arange(4), 4))
    assert fresh == [0, 1, 2, 3]
    # World 0 resets: copy 0 still has three worlds, copy 3 is full, so a free copy opens.
    copies, fresh = variants.assign(np.array([0]))
    assert fresh == [4] and copies.tolist() == [4]
    # Three more join copy 4 without drawing; the fifth opens another.
    copies, fresh = variants.assign(np.array([1, 2, 3, 5]))
    assert copies.tolist() == [4, 4, 4, 0] and fresh == [0]


def test_a_world_alone_on_a_copy_gets_a_fresh_draw_at_every_reset():
    variants = ModelVariants(1, 8)
    assert variants.size == 1
    for _ in range(3):
        copies, fresh = variants.assign(np.array([0]))
        assert copies.tolist() == [0] and fresh == [0]


def test_the_assignment_state_round_trips_and_a_foreign_one_is_refused():
    a, b = ModelVariants(64, 8), ModelVariants(64, 8)
    for _ in random_resets(a, 64, 20):
        pass
    b.set_state(a.get_state())
    ids = np.arange(0, 64, 3)
    assert a.assign(ids)[1] == b.assign(ids)[1]
    np.testing.assert_array_equal(a.of_world, b.of_world)
    with pytest.raises(ValueError, match='worlds_per_model'):
        ModelVariants(64, 4).set_state(a.get_state())
    with pytest.raises(ValueError, match='worlds_per_model 1'):
        ModelVariants(64, 4).check_state(None)


def shared_env(num=32, share=4, **cfg):
    return VecLocomotionEnv(from_dict(EnvConfig, {
        'num_envs': num, 'seed': 3, 'num_threads': 1,
        'randomization': {'worlds_per_model': share, 'push_interval_s': 0.0}, **cfg}))


def physical_params(env):
    """[N, 5] friction, base mass, base CoM x, first actuator gain, link mass ratio of each
    world's model: what the world steps with."""
    p, base = env.physics, env.physics.base_body
    return np.array([[m.geom_friction[p.floor_geom, 0], m.body_mass[base], m.body_ipos[base, 0],
                      m.actuator_gainprm[0, 0], m.body_mass[-1]] for m in p.models])


def test_worlds_keep_their_physics_through_an_episode_and_observe_their_own_copy():
    env = shared_env(episode_length_s=1.3)  # time-outs as well as falls reset worlds
    p, base = env.physics, env.physics.base_body
    rng = np.random.default_rng(0)
    try:
        assert len(p.copies) == pool_size(32, 4) < 32
        params = physical_params(env)
        draws = {tuple(row) for row in params}
        for _ in range(150):
            _, _, terminated, truncated, _ = env.step(rng.normal(0, 1.5, (32, env.num_actions)))
            now = physical_params(env)
            done = terminated | truncated
            # A world that did not reset steps with the same parameters as before.
            np.testing.assert_array_equal(now[~done], params[~done])
            params = now
            draws |= {tuple(row) for row in now}
            # The privileged truth is the copy the world steps with.
            for i, m in enumerate(p.models):
                assert m.geom_friction[p.floor_geom, 0] == env.friction[i]
                assert m.body_mass[base] == pytest.approx(
                    p._mass0[base] * env.mass_scale[i] + env.added_mass[i])
                assert m.actuator_gainprm[0, 0] == pytest.approx(
                    p.robot.kp[0] * env.motor_strength[i])
        # Draws keep coming as worlds reset: more parameter sets than copies.
        assert len(draws) > len(p.copies)
        assert len({id(m) for m in p.models}) < 32
    finally:
        env.close()


def test_shared_copies_resume_bit_for_bit():
    a, b = shared_env(), shared_env()
    rng = np.random.default_rng(1)
    actions = [rng.normal(0, 1.5, (32, a.num_actions)) for _ in range(120)]
    try:
        for act in actions[:60]:
            a.step(act)
        b.set_state(a.get_state())
        for act in actions[60:]:
            out_a, out_b = a.step(act), b.step(act)
            np.testing.assert_array_equal(out_a[0]['policy'], out_b[0]['policy'])
        np.testing.assert_array_equal(physical_params(a), physical_params(b))
        with pytest.raises(ValueError, match='worlds_per_model'):
            shared_env(share=8).set_state(a.get_state())
        # A damaged state is refused by the key it lacks, before anything changes (a steps on,
        # so its state would move b).
        a.step(actions[0])
        before = b.get_state()
        assert not np.array_equal(a.get_state()['physics'], before['physics'])
        for damage in ('filling', 'params', 'friction'):
            state = a.get_state()
            if damage == 'friction':
                del state['model_copies']['params'][damage]
            else:
                del state['model_copies'][damage]
            with pytest.raises(ValueError, match=f'{damage}.*damaged'):
                b.set_state(state)
        np.testing.assert_array_equal(b.get_state()['physics'], before['physics'])
    finally:
        a.close()
        b.close()


def test_evaluation_gives_every_episode_its_own_draw():
    from claw_rl_ros.core.evaluation.evaluator import eval_env_config
    cfg = from_dict(EnvConfig, {'randomization': {'worlds_per_model': 8}})
    assert eval_env_config(cfg, 20, (0.5, 0.0, 0.0), 0).randomization.worlds_per_model == 1


def test_worlds_per_model_out_of_range_is_refused_by_name():
    from claw_rl_ros.core.config import ConfigError
    for bad in (0, 65, 2.5):
        with pytest.raises((ConfigError, ValueError), match='worlds_per_model'):
            from_dict(EnvConfig, {'randomization': {'worlds_per_model': bad}})


def test_an_offline_run_resumes_its_shared_copies_and_refuses_another_setting(tmp_path):
    from claw_rl_ros.core.config import ConfigError
    from claw_rl_ros.core.learning import checkpoint as ckpt
    from claw_rl_ros.core.learning.runner import OnPolicyRunner
    from test_training import tiny_config
    shared = {'env': {'randomization': {'worlds_per_model': 4}}}
    runner = OnPolicyRunner(tiny_config(**shared), tmp_path / 'run')
    runner.train_one_epoch()
    runner.save()
    copies = physical_params(runner.env)
    runner.close()
    again = OnPolicyRunner(tiny_config(**shared), tmp_path / 'again')
    again.load(ckpt.latest_checkpoint(tmp_path / 'run'))
    assert again.env_resumed
    np.testing.assert_array_equal(physical_params(again.env), copies)
    again.close()
    # A checkpoint of per-world copies cannot continue with shared ones: one line naming it.
    own = OnPolicyRunner(tiny_config(), tmp_path / 'own')
    own.train_one_epoch()
    path = own.save()
    own.close()
    other = OnPolicyRunner(tiny_config(**shared), tmp_path / 'other')
    with pytest.raises(ConfigError, match='env: .*worlds_per_model 1; resume with that'):
        other.load(path)
    other.close()
