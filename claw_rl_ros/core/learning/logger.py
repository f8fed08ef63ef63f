"""Training logs: metrics.csv, TensorBoard event files, a live progress line, the curve PNG."""

from __future__ import annotations

import csv
import math
from pathlib import Path
import sys
from typing import TextIO

# Columns shown in the progress line: (metric key, label, format).
PROGRESS = (('steps_per_s', 'steps/s', '{:,.0f}'), ('mean_reward', 'reward', '{:.3f}'),
            ('mean_episode_length_s', 'ep len', '{:.1f}s'),
            ('tracking_error/lin_vel_x', 'vx err', '{:.3f}'),
            ('terrain_level/mean', 'terrain lvl', '{:.2f}'),
            ('kl_to_teacher', 'KL(T||S)', '{:.4f}'))


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f'{seconds // 60}m{seconds % 60:02d}s'


class MetricsLogger:
    """Append one row per iteration to metrics.csv and TensorBoard; print progress."""

    def __init__(self, run_dir: Path, resume_iteration: int = 0, stream: TextIO | None = None,
                 tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.csv_path = self.run_dir / 'metrics.csv'
        # sys.stdout at construction, not at import (it may have been replaced since).
        self.stream = stream if stream is not None else sys.stdout
        self.columns: list[str] | None = None
        if resume_iteration and self.csv_path.exists():
            self._truncate(resume_iteration)
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(str(self.run_dir), purge_step=resume_iteration or None)

    def _truncate(self, iteration: int) -> None:
        # A resumed run continues the curve: drop rows logged after its checkpoint.
        with open(self.csv_path, newline='') as f:
            rows = list(csv.DictReader(f))
        if not rows:
            return
        self.columns = list(rows[0].keys())
        kept = [r for r in rows if int(r['iteration']) <= iteration]
        with open(self.csv_path, 'w', newline='') as f:
            writer = csv.DictWriter(f, fieldnames=self.columns)
            writer.writeheader()
            writer.writerows(kept)

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        row = {'iteration': iteration, **metrics}
        new_file = not self.csv_path.exists()
        if self.columns is None:
            self.columns = list(row)
        with open(self.csv_path, 'a', newline='') as f:
            writer = csv.DictWriter(f, fieldnames=self.columns, extrasaction='ignore')
            if new_file:
                writer.writeheader()
            writer.writerow(row)
        if self.writer is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self.writer.add_scalar(key, value, iteration)

    def progress(self, iteration: int, total: int, metrics: dict[str, float],
                 elapsed: float, eta: float) -> None:
        parts = [f'it {iteration:>5}/{total}']
        for key, label, fmt in PROGRESS:
            if key in metrics:
                parts.append(f'{label} {fmt.format(metrics[key])}')
        parts.append(f'{_duration(elapsed)} elapsed, ETA {_duration(eta)}')
        print(' | '.join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def plot_learning_curve(csv_path: Path, png_path: Path) -> Path:
    """Mean reward, episode length and tracking error against env steps, as a PNG."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    with open(csv_path, newline='') as f:
        rows = list(csv.DictReader(f))
    steps = [float(r['total_steps']) / 1e6 for r in rows]
    panels = [('mean_reward', 'mean reward / step'),
              ('mean_episode_length_s', 'episode length [s]'),
              ('tracking_error/lin_vel_x', 'vx tracking error [m/s]')]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2))
    for ax, (key, title) in zip(axes, panels):
        values = [float(r[key]) if r.get(key) not in (None, '') else float('nan') for r in rows]
        ax.plot(steps, values)
        ax.set_title(title)
        ax.set_xlabel('env steps [M]')
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return png_path
