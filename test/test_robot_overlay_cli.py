"""``--robot-overlay`` everywhere: claw-rl train, eval, verify (the gate's graph and the transfer
suite), replay --compare-sim and the launch graphs take a robot overlay (claw-rl sysid's file),
use it, and refuse a bad one by name (exit 2, one line) before building anything.

One tiny training run with an overlay (module fixture) serves the checks of what its student
carries and who accepts it; the CLI runs in process (``main``), as a console run does.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
import re
import shutil

import numpy as np
import pytest
import yaml

from claw_rl_ros.cli import main
from claw_rl_ros.commands.verify import verify_nodes
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.export.policy_card import policy_card
from claw_rl_ros.core.replay.recording import Recorder
from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.verify import transfer_suite as suite
from claw_rl_ros.core.wire_format import Float64ArrayWriter, JointStateWriter
from claw_rl_ros.launch_graph import GRAPHS, resolve
from claw_rl_ros.core.config import ConfigError

WALKER = Path(__file__).parent / 'fixtures' / 'walker.onnx'
ENV = yaml.safe_load((Path(__file__).resolve().parents[1] / 'config' / 'verify.yaml')
                     .read_text())['env']
# An identified robot unlike the YAML's (Kp 30, Kd 0.75, armature 0.01, the URDF's joint
# friction 0.02 and damping 0.05, delay 0-2 steps): every number differs from the default.
GROUPS = {'hip': {'kp': 40.0, 'kd': 1.0}, 'thigh': {'kp': 38.0, 'kd': 0.9},
          'calf': {'kp': 36.0, 'kd': 0.8}}
FIT = {'joint_groups': {g: {**v, 'frictionloss': 0.03, 'damping': 0.07, 'armature': 0.02}
                        for g, v in GROUPS.items()},
       'action_delay_s': 0.01}
TINY = {'env': {'num_envs': 4, 'episode_length_s': 0.5, 'num_threads': 1},
        'policy': {'actor_hidden_dims': [8], 'critic_hidden_dims': [8]},
        'ppo': {'num_learning_epochs': 1, 'num_mini_batches': 1},
        'runner': {'num_steps_per_env': 4, 'max_iterations': 1, 'save_interval': 1, 'seed': 3,
                   'eval_episodes': 1, 'torch_threads': 1}}


def fit_kp(robot) -> list[float]:
    """[J] the overlay's Kp in the robot's joint order."""
    return [next(v['kp'] for g, v in GROUPS.items() if g in j) for j in robot.joint_names]


def refusal(capsys, argv: list[str]) -> str:
    """The one line claw-rl prints refusing ``argv`` (exit status 2)."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'Traceback' not in err, err
    return err


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A one-iteration run trained with FIT given from a folder that is then renamed (the run
    must not need it): (run dir, student.onnx, sha256 of the overlay file)."""
    root = tmp_path_factory.mktemp('overlay_run')
    given = root / 'fits' / 'fit.yaml'
    given.parent.mkdir()
    given.write_text(yaml.safe_dump(FIT))
    (root / 'tiny.yaml').write_text(yaml.safe_dump(TINY))
    run = root / 'run'
    assert main(['train', '--config', str(root / 'tiny.yaml'), '--robot-overlay', str(given),
                 '--run-dir', str(run)]) == 0
    sha = hashlib.sha256(given.read_bytes()).hexdigest()
    given.parent.rename(root / 'fits_moved')
    return run, run / 'student.onnx', sha


@pytest.fixture(scope='module')
def recording(tmp_path_factory):
    """A recording of the default pose with thigh commands 0.3 rad ahead, 0.6 s at 50 Hz."""
    robot = load_robot()
    path = tmp_path_factory.mktemp('recording') / 'run.mcap'
    rec = Recorder(path, {'robot': robot.name, 'joints': ','.join(robot.joint_names)})
    states = rec.add_topic('/joint_states', 'sensor_msgs/msg/JointState')
    commands = rec.add_topic('/joint_commands', 'std_msgs/msg/Float64MultiArray')
    state, command = JointStateWriter(robot.joint_names), Float64ArrayWriter(robot.num_joints)
    zero = np.zeros(robot.num_joints)
    state.fill(robot.default_joint_pos, zero, zero)
    command.data[:] = robot.default_joint_pos + 0.3 * np.array(
        ['thigh' in j for j in robot.joint_names])
    for k in range(30):
        t = 1.0 + k * robot.control_dt
        state.set_stamp(t)
        ns = int(t * 1e9)
        rec.write(states, '/joint_states', state.payload(), ns, ns)
        rec.write(commands, '/joint_commands', command.payload(), ns + 1000, ns + 1000)
    rec.close()
    return path


def test_train_copies_the_overlay_into_the_run_and_its_student_carries_it(trained):
    run, model, sha = trained
    copy = run / 'robot_overlay.yaml'
    assert yaml.safe_load(copy.read_text()) == FIT
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == sha  # the bytes, unchanged
    cfg = yaml.safe_load((run / 'config.yaml').read_text())
    assert cfg['env']['robot_overlay'] == str(copy.resolve())
    spec = OnnxPolicy(model).spec
    assert spec['kp'] == fit_kp(load_robot())
    assert set(spec['kd']) == {0.8, 0.9, 1.0}
    # Rotor inertia and the delay (0-2 steps re-centred on the fitted 10 ms = 2 steps of 5 ms).
    assert spec['actuator']['armature'] == 0.02 and spec['actuator']['delay_steps'] == [1, 3]
    assert spec['robot_overlay'] == {'sha256': sha, 'joint_frictionloss': [0.03] * 12,
                                     'joint_damping': [0.07] * 12}
    card = policy_card(model)
    assert f'- robot overlay: sha256 `{sha[:12]}`' in card
    assert 'joint friction 0.03 N m, joint damping 0.07 N m s/rad' in card
    # A student trained without one says so.
    assert '- robot overlay: none' in policy_card(WALKER)


def test_a_resumed_run_keeps_its_own_copy_wherever_the_run_moved(trained, tmp_path, capsys):
    run, _, sha = trained
    # A run trained in ``first`` whose directory was then moved: its config names a copy
    # that is no longer there.
    first, moved = tmp_path / 'first', tmp_path / 'moved_run'
    shutil.copytree(run, first)
    cfg = yaml.safe_load((first / 'config.yaml').read_text())
    cfg['env']['robot_overlay'] = str(first / 'robot_overlay.yaml')
    (first / 'config.yaml').write_text(yaml.safe_dump(cfg))
    first.rename(moved)
    err = refusal(capsys, ['train', '--resume', str(moved), '--robot-overlay',
                           str(moved / 'robot_overlay.yaml')])
    assert err.startswith('claw-rl: error: --robot-overlay: a resumed run trains on the robot')
    assert main(['train', '--resume', str(moved), '--set', 'runner.max_iterations=2']) == 0
    cfg = yaml.safe_load((moved / 'config.yaml').read_text())
    assert cfg['env']['robot_overlay'] == str((moved / 'robot_overlay.yaml').resolve())
    assert OnnxPolicy(moved / 'student.onnx').spec['robot_overlay']['sha256'] == sha


def test_eval_refuses_the_student_without_its_overlay_and_runs_with_it(
        trained, tmp_path, capsys):
    run, model, sha = trained
    err = refusal(capsys, ['eval', '--model', str(model), '--episodes', '1'])
    assert 'kp: model has [40.0' in err and 'robot has [30.0' in err
    assert f'hint: the model was trained with a robot overlay (sha256 {sha[:12]}' in err
    assert 'give the same as robot_overlay (--robot-overlay)' in err
    out = tmp_path / 'eval.json'
    copy = str((run / 'robot_overlay.yaml').resolve())
    assert main(['eval', '--model', str(model), '--episodes', '1', '--robot-overlay', copy,
                 '--json', str(out)]) == 0
    assert json.loads(out.read_text())['robot_overlay'] == copy
    # The run's config names its overlay: --config is enough.
    assert main(['eval', '--model', str(model), '--episodes', '1', '--config',
                 str(run / 'config.yaml'), '--json', str(out)]) == 0
    assert json.loads(out.read_text())['robot_overlay'] == copy
    # The overlay is matched by its numbers, not its bytes: an edited comment (another sha256)
    # is the same robot; the model's record of the overlay is not compared.
    edited = tmp_path / 'edited.yaml'
    edited.write_text('# re-fitted, same numbers\n' + yaml.safe_dump(FIT))
    assert main(['eval', '--model', str(model), '--episodes', '1', '--robot-overlay',
                 str(edited)]) == 0
    # A student trained without an overlay, given one.
    err = refusal(capsys, ['eval', '--model', str(WALKER), '--robot-overlay', copy])
    assert 'kp: model has [30.0' in err and f'this robot has the robot overlay {copy}' in err


def test_verify_gives_the_gate_nodes_the_overlay_and_refuses_the_student_without_it(
        trained, capsys):
    run, model, _ = trained
    copy = str((run / 'robot_overlay.yaml').resolve())
    nodes = {n.name: n for n in verify_nodes(str(model), 'claw_quadruped', Path('v.yaml'), 3,
                                             overlay=copy)}
    assert nodes['sim_node'].parameters['robot_overlay'] == copy
    assert nodes['policy_node'].parameters['robot_overlay'] == copy
    box, = verify_nodes(str(model), 'claw_quadruped', Path('v.yaml'), 3, composed=True,
                        overlay=copy)
    hosted = [json.loads(a) for a in box.arguments if a.startswith('{')]
    assert [h['robot_overlay'] for h in hosted] == [copy, copy]
    assert all('robot_overlay' not in n.parameters for n in verify_nodes(
        str(WALKER), 'claw_quadruped', Path('v.yaml'), 3))
    # Refused before a graph starts.
    for suite_name in ('gate', 'transfer'):
        err = refusal(capsys, ['verify', '--model', str(model), '--suite', suite_name])
        assert 'kp: model has [40.0' in err and '--robot-overlay' in err


def test_the_transfer_suite_steps_the_overlaid_robot_in_both_engines(trained, tmp_path):
    run, model, _ = trained
    copy = str((run / 'robot_overlay.yaml').resolve())
    out = tmp_path / 'cells.json'
    assert main(['verify', '--suite', 'transfer', '--model', str(model), '--robot-overlay', copy,
                 '--episodes', '1', '--seconds', '0.2', '--json', str(out)]) in (0, 1)
    record = json.loads(model.with_suffix('.transfer.json').read_text())
    assert record['robot_overlay'] == copy
    # Every cell ran the student, PyBullet's too: a robot without the overlay (Kp 30) would
    # have refused the student (Kp 40) and failed the cell with that error.
    cells = json.loads(out.read_text())
    assert len(cells) == len(suite.CELLS) + len(suite.EXTRA_CELLS)
    assert [c for c in cells if c.get('error')] == []
    assert {c['family'] for c in cells} >= {'second engine', 'actuator'}
    # The MuJoCo cells' world: the overlay's gains, joint terms and (nominal) delay.
    robot = load_robot(overlay=copy)
    session = suite.cell_session(suite.CELLS[0], robot,
                                 suite.cell_env(suite.CELLS[0], robot, ENV))
    try:
        p = session.physics
        model_ = p.models[0]
        assert np.allclose(model_.dof_frictionloss[p.vadr], 0.03)
        assert np.allclose(model_.dof_damping[p.vadr], 0.07)
        assert np.allclose(model_.dof_armature[p.vadr], 0.02)
        assert np.allclose(p.copy_kp[0], fit_kp(robot))
        assert session.latency_substeps == 2  # 10 ms at 5 ms steps
    finally:
        session.close()
    # Without an overlay the nominal cell has no delay; the physics-step cell counts the fitted
    # delay in its own 1 ms steps.
    assert suite.cell_env(suite.CELLS[0], load_robot(), ENV) \
        .randomization.action_latency_substeps == (0, 0)
    step = next(c for c in suite.CELLS if c.family == 'physics step')
    assert suite.cell_env(step, robot, ENV).randomization.action_latency_substeps == (10, 10)


def rms_mean(text: str) -> float:
    return float(re.search(r'RMS joint error mean ([0-9.]+) rad', text)[1])


def test_replay_compare_sim_simulates_the_overlaid_robot(recording, tmp_path, capsys):
    fit = tmp_path / 'fit.yaml'
    fit.write_text(yaml.safe_dump(FIT))
    png = str(tmp_path / 'sim.png')
    capsys.readouterr()
    assert main(['replay', str(recording), '--compare-sim', '--png', png]) == 0
    plain = rms_mean(capsys.readouterr().out)
    assert main(['replay', str(recording), '--compare-sim', '--png', png, '--robot-overlay',
                 str(fit)]) == 0
    overlaid = rms_mean(capsys.readouterr().out)
    # The stiffer, more damped drives follow the 0.3 rad step another way.
    assert plain > 0 and overlaid > 0 and abs(plain - overlaid) > 1e-3


def test_graphs_pass_the_overlay_to_their_robot_nodes(tmp_path, monkeypatch):
    fit = tmp_path / 'fit.yaml'
    fit.write_text(yaml.safe_dump(FIT))
    monkeypatch.chdir(tmp_path)
    given = {'robot_overlay': 'fit.yaml'}  # relative: made absolute for every process
    want = str(fit)
    for name, nodes in (('sim', ['sim_node']), ('policy', ['policy_node']),
                        ('control', ['sim_node', 'policy_node']), ('deploy', ['policy_node'])):
        resolved = resolve(GRAPHS[name], given)
        assert [n.name for n in resolved if n.parameters.get('robot_overlay') == want] == \
            nodes, name
        assert all('robot_overlay' not in n.parameters for n in resolve(GRAPHS[name])), name
    # The recorder does not simulate: it only names the robot.
    recorder, *_ = resolve(GRAPHS['control'], {**given, 'record': 'r.mcap'})
    assert 'robot_overlay' not in recorder.parameters
    # Train: the trainer, every actor and the control loop; the config's, else none.
    train = resolve(GRAPHS['train'], given)
    assert [n.name for n in train if n.parameters.get('robot_overlay') == want] == [
        'trainer', 'actor_0', 'actor_1', 'sim_node', 'policy_node']
    from_config = resolve(GRAPHS['train'], {'set': f'env.robot_overlay={fit}'})
    assert {n.parameters.get('robot_overlay') for n in from_config} == {want}
    assert all('robot_overlay' not in n.parameters for n in resolve(GRAPHS['train']))


def changed(path: str, value) -> dict:
    """FIT with the value at ``path`` (dotted) replaced."""
    data = json.loads(json.dumps(FIT))
    *parents, key = path.split('.')
    node = data
    for part in parents:
        node = node[part]
    node[key] = value
    return data


# case -> (the file: None missing, 'DIR' a directory, text, or a mapping to dump; the words
# that name what is wrong).
BAD = {
    'missing': (None, 'no such file'),
    'a directory': ('DIR', 'a directory'),
    'not a mapping': ('[1, 2]\n', 'top level must be a mapping, got list'),
    'not YAML': ('joint_groups: [\n', 'not valid YAML'),
    'a group matching no joint': (
        {**FIT, 'joint_groups': {k: v for k, v in FIT['joint_groups'].items() if k != 'calf'}},
        "joint_groups: no entry matches joint 'FL_calf_joint'"),
    'kp NaN': (changed('joint_groups.hip.kp', float('nan')),
               'joint_groups.hip.kp: NaN is not allowed'),
    'kp negative': (changed('joint_groups.hip.kp', -1.0),
                    'joint_groups.hip.kp: -1.0 is out of range'),
    'delay -1': (changed('action_delay_s', -1),
                 'action_delay_s: -1: give the command -> motion delay in seconds, 0 to 1'),
    "delay 'abc'": (changed('action_delay_s', 'abc'), "action_delay_s: 'abc': give the"),
}


def bad_overlay(tmp_path: Path, case: str) -> Path:
    """The overlay file of ``case`` (BAD); none for the missing one."""
    path = tmp_path / 'bad.yaml'
    content = BAD[case][0]
    if content == 'DIR':
        path.mkdir()
    elif isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_text(yaml.safe_dump(content))
    return path


@pytest.mark.parametrize('case', BAD)
def test_a_bad_overlay_is_refused_by_name_by_every_entry_point(case, recording, tmp_path,
                                                               capsys):
    path, why = bad_overlay(tmp_path, case), BAD[case][1]
    tiny = tmp_path / 'tiny.yaml'
    tiny.write_text(yaml.safe_dump(TINY))
    run = tmp_path / 'run'
    entry_points = {
        'train': ['train', '--config', str(tiny), '--run-dir', str(run)],
        'eval': ['eval', '--model', str(WALKER)],
        'verify': ['verify', '--model', str(WALKER)],
        'transfer': ['verify', '--suite', 'transfer', '--model', str(WALKER)],
        'replay': ['replay', str(recording), '--compare-sim'],
    }
    for name, argv in entry_points.items():
        err = refusal(capsys, [*argv, '--robot-overlay', str(path)])
        assert err.startswith('claw-rl: error: --robot-overlay') and why in err, (name, err)
        assert 'bad.yaml' in err, (name, err)
    # Before anything was built: no run directory.
    assert not run.exists()
    # The config's env.robot_overlay is checked the same way, named by its key.
    err = refusal(capsys, ['train', '--config', str(tiny), '--run-dir', str(run), '--set',
                           f'env.robot_overlay={path}'])
    assert f'{tiny}: env.robot_overlay' in err and why in err
    # The graphs, by argument.
    for graph in ('sim', 'policy', 'control', 'deploy', 'train'):
        with pytest.raises(ConfigError) as info:
            resolve(GRAPHS[graph], {'robot_overlay': str(path)})
        assert info.value.key == 'robot_overlay' and why in str(info.value), graph
        assert '\n' not in str(info.value)
    assert not os.path.exists(run)
