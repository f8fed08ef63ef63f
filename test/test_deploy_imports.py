"""The robot-side nodes (and the CLI up to a command that trains) load without torch: a real
robot's computer runs policy_node (and a sim2sim check sim_node) with onnxruntime alone, and
their start-up stays short. The control loop's training helpers they import (loop_actor,
rollout_summary) are numpy-only."""

import json
import subprocess
import sys

HEAVY = ('torch', 'torch.utils.tensorboard', 'matplotlib')


def loaded_after(code: str, modules) -> list[str]:
    """Which of ``modules`` a fresh interpreter holds after running ``code``."""
    probe = f'{code}\nimport json, sys\nprint(json.dumps([m for m in {tuple(modules)!r} ' \
        'if m in sys.modules]))'
    result = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_policy_node_and_sim_node_import_without_torch():
    assert loaded_after('import claw_rl_ros.nodes.policy.policy_node, '
                        'claw_rl_ros.nodes.sim.sim_node', HEAVY) == []


def test_the_cli_and_the_verify_gate_load_without_torch():
    """`claw-rl verify` (and every command but those that train) starts without torch's ~1 s
    import: the parser and the verify path import only what the gate runs."""
    assert loaded_after('from claw_rl_ros.cli import build_parser\n'
                        'build_parser()\n'
                        'import claw_rl_ros.commands.verify, claw_rl_ros.nodes.verify_driver\n'
                        'import claw_rl_ros.core.verify.gate_scoring, '
                        'claw_rl_ros.core.export.policy_card', HEAVY) == []


def test_the_policy_node_does_not_load_the_training_env():
    """The policy node imports the control loop's record helpers, not the 1-world training env
    they sit beside (the sim node's, in training): ~35 ms less of every policy node's start-up.
    (It still loads MuJoCo when it loads the robot: the robot's sizes come from its kinematics.)
    """
    assert loaded_after('import claw_rl_ros.nodes.policy.policy_node', (
        'claw_rl_ros.core.sim.training_session', 'claw_rl_ros.core.sim.env', *HEAVY)) == []
