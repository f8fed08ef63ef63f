"""The trainer's own actor (trainer_node ``device_worlds``, core/live/device_actor.py): worlds
of the config's env, on either engine, acting with each pushed student and handing their chunk
to the trainer without DDS; a run it trained resumes on the other engine (one checkpoint
layout); the train graph wires it; trainer_node runs it as a real process with no actor node;
bad values are refused by name."""

import json
import os

import pytest

from claw_rl_ros.cli import main
from claw_rl_ros.core.config import ConfigError, from_dict
from claw_rl_ros.core.learning import checkpoint as ckpt
from claw_rl_ros.core.learning.train_config import TrainConfig
from claw_rl_ros.core.live.device_actor import DeviceActor
from claw_rl_ros.core.live.live_trainer import LiveTrainer
from claw_rl_ros.launch_graph.description import resolve
from claw_rl_ros.launch_graph.graphs import GRAPHS
from ros_helpers import NodeProcess

TINY = {'env': {'num_envs': 8, 'episode_length_s': 0.5, 'num_threads': 1},
        'policy': {'actor_hidden_dims': [32, 32], 'critic_hidden_dims': [32, 32]},
        'ppo': {'num_learning_epochs': 1, 'num_mini_batches': 2},
        'runner': {'num_steps_per_env': 8, 'seed': 3, 'keep_checkpoints': 2,
                   'eval_episodes': 0, 'torch_threads': 1}}


def config(physics: str) -> TrainConfig:
    return from_dict(TrainConfig, {**TINY, 'env': {**TINY['env'], 'physics': physics}},
                     source='test')


@pytest.mark.parametrize('physics', ['mujoco', 'mujoco_warp'])
def test_the_device_actor_alone_trains_the_trainer(robot, tmp_path, physics):
    cfg = config(physics)
    trainer = LiveTrainer(cfg, robot, tmp_path, tensorboard=False)
    device = DeviceActor(cfg, 6, seed=2, robot=robot)
    try:
        assert device.offer_chunk(trainer) is False  # no student yet: nothing to act with
        for _ in range(2):
            device.use(trainer.export())
            assert device.offer_chunk(trainer) is None  # collected and accepted
            assert device.offer_chunk(trainer) is False  # one chunk per student
            assert trainer.ready()
            trainer.iterate()
        assert trainer.learner.iteration == 2
        assert trainer.gate.counters.as_dict()['accepted'] == 2
        assert type(device.env.physics).__name__ == \
            {'mujoco': 'BatchedPhysics', 'mujoco_warp': 'WarpPhysics'}[physics]
    finally:
        device.close()
        trainer.finish(stopped=True)
    assert ckpt.latest_checkpoint(tmp_path) is not None


def test_a_run_trained_on_mujoco_warp_resumes_on_the_cpu_engine(robot, tmp_path):
    """One checkpoint layout: the device actor's run on MuJoCo Warp goes on offline on MuJoCo."""
    cfg = config('mujoco_warp')
    trainer = LiveTrainer(cfg, robot, tmp_path, tensorboard=False)
    device = DeviceActor(cfg, 6, seed=2, robot=robot)
    try:
        device.use(trainer.export())
        assert device.offer_chunk(trainer) is None
        trainer.iterate()
    finally:
        device.close()
        trainer.finish(stopped=True)
    assert main(['train', '--resume', str(tmp_path), '--no-export', '--set',
                 'runner.max_iterations=2', '--set', 'env.physics=mujoco']) == 0
    assert ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path))['iteration'] == 2


def test_a_model_for_another_robot_and_bad_world_counts_are_refused(robot, tmp_path):
    cfg = config('mujoco')
    for worlds in (0, -3, 70000):
        with pytest.raises(ConfigError, match=f'device_worlds: {worlds}: use 1 to 65536'):
            DeviceActor(cfg, worlds, seed=0, robot=robot)
    device = DeviceActor(cfg, 2, seed=0, robot=robot)
    try:
        with pytest.raises(ValueError, match='device actor: model .* rejected'):
            device.use(b'not an onnx model')
        assert not device.actor.may_collect()  # still no student: nothing is collected
    finally:
        device.close()


def test_the_train_graph_gives_the_trainer_its_worlds_and_counts_their_chunk():
    graph = GRAPHS['train']
    nodes = resolve(graph, {'device_worlds': '64', 'actors': '0', 'control_loop': 'false'})
    assert [n.name for n in nodes] == ['trainer']
    params = nodes[0].parameters
    assert (params['device_worlds'], params['chunks_per_iteration']) == (64, 1)
    nodes = resolve(graph, {'device_worlds': '64', 'actors': '2', 'control_loop': 'false'})
    params = nodes[0].parameters
    assert params['chunks_per_iteration'] == 3
    assert params['device_seed'] not in [n.parameters['seed'] for n in nodes[1:]]
    assert resolve(graph)[0].parameters['device_worlds'] == 0
    with pytest.raises(ConfigError, match="actors: '0' is not a whole number >= 1"):
        resolve(graph, {'actors': '0'})
    with pytest.raises(ConfigError, match="device_worlds: 'many'"):
        resolve(graph, {'device_worlds': 'many'})


def test_trainer_node_refuses_a_bad_world_count_before_writing_its_run(ros_env, tmp_path):
    trainer = NodeProcess('trainer_node', ros_env, tmp_path, {
        'run_dir': str(tmp_path / 'run'), 'device_worlds': -3})
    assert trainer.wait_exit(timeout=120) == 1
    assert 'refusing to start: trainer_node: device_worlds: -3: use 1 to 65536' in trainer.log
    assert not (tmp_path / 'run').exists()


def test_trainer_node_trains_on_its_own_worlds_without_an_actor_node(ros_env, tmp_path):
    """A real trainer_node process, no actor on the graph: its device actor's chunks make the
    iterations, and it ends as a run does (summary, exit 0)."""
    (tmp_path / 'tiny.yaml').write_text(json.dumps(TINY))
    trainer = NodeProcess('trainer_node', ros_env, tmp_path, {
        'config': str(tmp_path / 'tiny.yaml'), 'run_dir': str(tmp_path / 'run'),
        'max_iterations': 3, 'device_worlds': 8, 'device_seed': 5, 'push_targets': ['none']})
    code = trainer.wait_exit(timeout=240)
    assert code == 0, trainer.log
    assert 'device actor: 8 worlds on mujoco (cpu)' in trainer.log
    summary = json.loads((tmp_path / 'run' / 'summary.json').read_text())
    assert summary['iterations'] == 3, summary
    assert os.path.isfile(tmp_path / 'run' / 'student.onnx') or summary.get('student_onnx')
