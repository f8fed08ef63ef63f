"""Which student a run deploys: the final one, or the best of the last (``runner.selection``).

During training the learner keeps a snapshot of the student every ``selection.every_s`` of
wall time (``candidates/model_<iteration>.pt``,
:meth:`~..learning.learner.Learner.save_candidate`).
At the end of the run each kept snapshot and the final student are exported to ONNX (what
would deploy) and evaluated on the validation set: the end-of-run evaluation's tiles and
command (0.5 m/s forward; every trained terrain type at its top level, or the plane), on a
terrain map of their own (``selection.terrain_seed``) and with env seeds of their own
(``selection.env_seeds``). Neither training nor the evaluation that reports the pick (the
end-of-run table, ``claw-rl eval``, the bench) sees that set.

The pick: fewest validation seeds failed (falls <= 5 % and vx error <= 0.15 m/s on every
tile), then the smallest worst vx error over tiles and seeds, then the newest.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
import json
import math
from pathlib import Path
import tempfile
from typing import Any

import torch

from ..config import ConfigError
from .evaluator import evaluate_terrains, PolicyFn
from ..export.onnx_policy import OnnxPolicy
from ..learning import checkpoint as ckpt
from ..sim.robot_spec import RobotSpec


@dataclass
class CandidateScore:
    """One student on the validation set: its counters and how it did."""

    iteration: int
    wall_time_s: float
    total_steps: int
    final: bool
    failed_seeds: int = 0
    worst_vx_error: float = math.inf  # over tiles and seeds; inf: a tile measured nothing
    falls: int = 0
    episodes: int = 0

    def rank(self) -> tuple[int, float, int]:
        """Smaller is better: failed seeds, worst vx error, then the newer of two."""
        return self.failed_seeds, self.worst_vx_error, -self.iteration


def validation_score(policy_fn: PolicyFn, cfg: Any, robot: RobotSpec,
                     score: CandidateScore) -> CandidateScore:
    """``score`` filled in by evaluating ``policy_fn`` once per ``selection.env_seeds`` on the
    validation tiles (``cfg`` a TrainConfig; ``runner.eval_episodes`` episodes per tile, 20
    when that is 0)."""
    sel = cfg.runner.selection
    terrains = cfg.env.terrain.columns if cfg.env.terrain.enabled else ('flat',)
    score.failed_seeds, score.worst_vx_error, score.falls, score.episodes = 0, 0.0, 0, 0
    for seed in sel.env_seeds:
        table = evaluate_terrains(policy_fn, cfg.env, robot, terrains,
                                  episodes=cfg.runner.eval_episodes or 20, seed=seed,
                                  terrain_seed=sel.terrain_seed)
        score.failed_seeds += not table.passed
        for row in table.rows():
            vx = row['vx_error']
            # A tile that measured nothing (every world fell before settling) is the worst.
            vx = math.inf if vx is None or not math.isfinite(vx) else vx
            score.worst_vx_error = max(score.worst_vx_error, vx)
            score.falls += row['falls']
            score.episodes += row['episodes']
    return score


def format_scores(scores: list[CandidateScore], picked: CandidateScore, cfg: Any) -> str:
    """The selection table: one row per student, the pick marked."""
    sel = cfg.runner.selection
    ground = f'terrain map {sel.terrain_seed}' if cfg.env.terrain.enabled else 'the plane'
    lines = [f'selection of the deployed student on the validation set ({ground}, '
             f'env seeds {" ".join(map(str, sel.env_seeds))}, '
             f'{cfg.runner.eval_episodes or 20} episodes per tile and seed):',
             f'  {"iteration":>9}  {"wall s":>7}  {"failed seeds":>12}  {"worst vx err":>12}  '
             f'{"falls":>9}']
    for s in scores:
        mark = ' <- picked' if s is picked else ''
        lines.append(f'  {s.iteration:>9}  {s.wall_time_s:>7.0f}  '
                     f'{f"{s.failed_seeds}/{len(sel.env_seeds)}":>12}  '
                     f'{s.worst_vx_error:>12.3f}  {f"{s.falls}/{s.episodes}":>9}'
                     f'{" (final)" if s.final else ""}{mark}')
    return '\n'.join(lines)


def select_student(learner: Any, robot: RobotSpec, run_dir: str | Path,
                   export: Any) -> tuple[torch.nn.Module, CandidateScore, dict[str, Any]]:
    """The student to deploy among the run's kept snapshots (older than the learner's
    iteration: a resume from an earlier checkpoint discards later ones) and the learner's
    final student; ``export(module, path)`` writes a module as ONNX. Returns the module, its
    score and the summary entry (every score, the pick, the validation set). A snapshot that
    cannot be read or no longer fits the student is skipped with a line saying why; with no
    snapshot the final student is returned unevaluated."""
    cfg = learner.cfg
    sel = cfg.runner.selection
    final = CandidateScore(learner.iteration, learner.elapsed_s, learner.total_steps, True)
    entries: list[tuple[CandidateScore, torch.nn.Module]] = []
    for iteration, path in ckpt.checkpoints_by_iteration(run_dir, ckpt.CANDIDATES):
        if iteration >= learner.iteration:
            continue
        module = copy.deepcopy(learner.policy)
        try:
            payload = ckpt.load_checkpoint(path)
            module.load_state_dict(payload['model'])
            score = CandidateScore(int(payload['iteration']), float(payload['elapsed_s']),
                                   int(payload['total_steps']), False)
        except (ConfigError, RuntimeError, KeyError, TypeError, ValueError) as exc:
            print(f'selection: skipped {path} ({type(exc).__name__}: {exc})', flush=True)
            continue
        entries.append((score, module))
    entries = entries[-sel.candidates:] + [(final, learner.policy)]
    summary: dict[str, Any] = {'terrain_seed': sel.terrain_seed, 'env_seeds': list(sel.env_seeds),
                               'final_iteration': learner.iteration}
    if len(entries) == 1:
        print(f'selection: no snapshot older than the final student (one is kept every '
              f'{sel.every_s:g} s of training): the final student is exported', flush=True)
        return learner.policy, final, {**summary, 'picked_iteration': learner.iteration,
                                       'candidates': []}
    with tempfile.TemporaryDirectory(prefix='selection_') as tmp:
        for score, module in entries:
            onnx = export(module, Path(tmp) / f'student_{score.iteration}.onnx')
            validation_score(OnnxPolicy(onnx, robot), cfg, robot, score)
    picked, module = min(entries, key=lambda e: e[0].rank())
    print(format_scores([s for s, _ in entries], picked, cfg), flush=True)
    return module, picked, {**summary, 'picked_iteration': picked.iteration,
                            'candidates': [to_json(s) for s, _ in entries]}


def to_json(score: CandidateScore) -> dict[str, Any]:
    """A score for summary.json (an infinite vx error, nothing measured, is null)."""
    out = asdict(score)
    out['worst_vx_error'] = out['worst_vx_error'] if math.isfinite(score.worst_vx_error) else None
    return out


def picked_snapshot(run_dir: str | Path) -> Path | None:
    """The snapshot a finished run exported as ``student.onnx`` when selection picked one
    other than the final student (``summary.json``'s ``selection``), else None (also for a
    run without a readable summary)."""
    try:
        sel = json.loads((Path(run_dir) / 'summary.json').read_text()).get('selection') or {}
        picked, final = int(sel['picked_iteration']), int(sel['final_iteration'])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError):
        return None  # (OverflowError: an infinite iteration)
    if picked < 0 or picked == final:
        return None
    return ckpt.checkpoint_path(run_dir, picked, ckpt.CANDIDATES)
