"""The robot-side nodes load without torch: a real robot's computer runs policy_node (and a
sim2sim check sim_node) with onnxruntime alone, and their start-up stays short. The control
loop's training helpers they import (loop_actor, rollout_summary) are numpy-only."""

import json
import subprocess
import sys

HEAVY = ('torch', 'torch.utils.tensorboard', 'matplotlib')


def test_policy_node_and_sim_node_import_without_torch():
    code = ('import json, sys\n'
            'import claw_rl_ros.nodes.policy_node, claw_rl_ros.nodes.sim_node\n'
            f'print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
