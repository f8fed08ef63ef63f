"""The end of a training run: the student exported as ``student.onnx`` and evaluated.

Offline (``claw-rl train``) and live (the trainer node) runs end here alike; with
``runner.selection`` the exported student is the best of the run's last snapshots
(:mod:`.selection`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import to_dict
from .evaluator import evaluate, evaluate_terrains, PolicyFn, TERRAIN_COMMAND, torch_policy_fn
from ..export.onnx_export import export_onnx
from ..export.onnx_policy import OnnxPolicy
from .selection import select_student
from ..sim.robot_spec import RobotSpec


def export_and_evaluate(learner: Any, robot: RobotSpec, run_dir: str | Path) -> dict[str, Any]:
    """End of a training run (offline or live): the :class:`~..learning.learner.Learner`'s
    student as ``run_dir/student.onnx`` (its iteration, env steps, algorithm and env.terrain in
    the metadata) and, if ``cfg.runner.eval_episodes``, its evaluation at 0.5 m/s forward (on
    terrain: on every type's top-level tile, :func:`evaluate_terrains`); returns the summary
    entries. With ``runner.selection.candidates`` the exported student is the best of the
    run's last snapshots and the final one on a validation set
    (:func:`~.selection.select_student`; ``selection`` in the summary, its iteration in the
    metadata). An actor that reads privileged observations (a teacher) is not deployable: it is
    not exported and is evaluated in torch on the same tiles (``eval_policy`` says so)."""
    policy, cfg = learner.policy, learner.cfg
    extra_metadata = {'iteration': learner.iteration, 'total_steps': learner.total_steps,
                      'algorithm': cfg.algorithm, 'terrain': to_dict(cfg.env.terrain)}
    out: dict[str, Any] = {}
    if policy.actor_obs_groups != ['policy']:
        print(f'actor reads {", ".join(policy.actor_obs_groups)}: not deployable, no '
              'student.onnx exported; evaluated in torch (the simulation\'s upper bound)')
        policy_fn: PolicyFn = torch_policy_fn(policy)
        out['eval_policy'] = 'privileged actor in torch (not exported)'
    else:
        def export(module: Any, path: Path) -> Path:
            return export_onnx(module, robot, path, extra_metadata=extra_metadata,
                               action_clip=cfg.env.clip_actions,
                               obs_history=cfg.env.policy_history)

        if cfg.runner.selection.candidates:
            # The best of the last students on the validation set, with its own counters.
            policy, picked, out['selection'] = select_student(learner, robot, run_dir, export)
            extra_metadata.update(iteration=picked.iteration, total_steps=picked.total_steps,
                                  final_iteration=learner.iteration)
        onnx_path = export(policy, Path(run_dir) / 'student.onnx')
        out['student_onnx'] = str(onnx_path)
        policy_fn = OnnxPolicy(onnx_path, robot)
    episodes = cfg.runner.eval_episodes
    if episodes and cfg.env.terrain.enabled:
        # On terrain: each type it trained on at its top level, on a map of its own seed, not
        # the training map (where every world starts on the easiest level); flat is the plane
        # (a flat heightfield for an actor that reads the scan).
        table = evaluate_terrains(policy_fn, cfg.env, robot, cfg.env.terrain.columns,
                                  episodes=episodes, seed=cfg.runner.seed + 1)
        print(f'evaluation at 0.5 m/s forward on the terrain tiles:\n{table.format()}',
              flush=True)
        out['eval_terrain'] = table.to_dict()
        out.update({'eval_forward_0.5': r.to_dict() for r in table.reports
                    if r.terrain == 'flat'})
    elif episodes:
        report = evaluate(policy_fn, cfg.env, robot, episodes=episodes,
                          command=TERRAIN_COMMAND, seed=cfg.runner.seed + 1)
        print(f'evaluation at 0.5 m/s forward:\n{report.format()}', flush=True)
        out['eval_forward_0.5'] = report.to_dict()
    return out
