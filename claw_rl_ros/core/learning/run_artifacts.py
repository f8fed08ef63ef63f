"""The files of a run directory, written the same way by ``claw-rl train`` and the live trainer.

``config.yaml`` (the resolved config), ``metrics.csv`` and TensorBoard events (one row per
iteration), the progress line with its ETA, and at the end ``learning_curve.png`` and
``summary.json`` (iterations, env steps, wall time, peak memory, plus what the loop adds, e.g.
the export and evaluation of ``student.onnx``). Checkpoints are the learner's
(:meth:`~.learner.Learner.save`).
"""

from __future__ import annotations

import json
from pathlib import Path
import resource
from typing import Any, Callable, TextIO

import yaml

from ..config import to_dict
from ..io import atomic_write_bytes
from .logger import MetricsLogger, plot_learning_curve
from .train_config import RunnerConfig, TrainConfig


def write_config(run_dir: str | Path, cfg: TrainConfig) -> None:
    """``run_dir/config.yaml``: the resolved config (a resume reads it back), atomically."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(run_dir / 'config.yaml',
                       yaml.safe_dump(to_dict(cfg), sort_keys=False).encode())


def eta_s(runner: RunnerConfig, iteration: int, elapsed_s: float) -> float:
    """Seconds left: the remaining iterations at the mean pace so far, capped by the time
    budget."""
    left = (runner.max_iterations - iteration) * elapsed_s / max(1, iteration)
    if runner.time_budget_s:
        left = min(left, max(0.0, runner.time_budget_s - elapsed_s))
    return left


def run_ended(runner: RunnerConfig, iteration: int, elapsed_s: float) -> bool:
    """``max_iterations`` or the time budget reached."""
    return iteration >= runner.max_iterations or \
        bool(runner.time_budget_s) and elapsed_s >= runner.time_budget_s


class RunArtifacts:
    """metrics.csv / TensorBoard / progress while training, curve and summary at the end."""

    def __init__(self, run_dir: str | Path, cfg: TrainConfig, resume_iteration: int = 0,
                 stream: TextIO | None = None, tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.logger = MetricsLogger(self.run_dir, resume_iteration=resume_iteration,
                                    stream=stream, tensorboard=tensorboard)
        self._closed = False

    def log(self, iteration: int, metrics: dict[str, float], elapsed_s: float) -> None:
        """One row; the progress line every ``log_interval`` iterations and at the end."""
        self.logger.log(iteration, metrics)
        r = self.cfg.runner
        if iteration % r.log_interval == 0 or run_ended(r, iteration, elapsed_s):
            self.logger.progress(iteration, r.max_iterations, metrics, elapsed_s,
                                 eta_s(r, iteration, elapsed_s))

    def close(self) -> None:
        """Flush and close the logs (idempotent)."""
        if not self._closed:
            self._closed = True
            self.logger.close()

    def finish(self, learner: Any, stopped: bool,
               evaluate: Callable[[], dict[str, Any]] | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Close the logs, draw the curve, write ``summary.json``: the learner's counters,
        ``stopped_by_user``, peak memory, ``extra``, and ``evaluate()`` (the export and
        evaluation) when training ran to its end. Returns the summary."""
        self.close()
        csv_path = self.run_dir / 'metrics.csv'
        if csv_path.exists():
            plot_learning_curve(csv_path, self.run_dir / 'learning_curve.png')
        summary: dict[str, Any] = {
            'iterations': learner.iteration, 'total_steps': learner.total_steps,
            'wall_time_s': round(learner.elapsed_s, 1), 'stopped_by_user': stopped,
            'peak_rss_mib': round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            **(extra or {})}
        if evaluate is not None and not stopped and learner.iteration:
            summary.update(evaluate())
        atomic_write_bytes(self.run_dir / 'summary.json', json.dumps(summary, indent=2).encode())
        return summary
