"""One lockstep episode as the sim stepped it, so a gate reads it whole instead of listening.

The sim node (with ``pause_after_s``) keeps a row per state it publishes from a ``~/reset`` to the
pause that ends the episode, and sends the rows once on ``~/episode``: a listener on ``odom`` and
``joint_states`` costs the 2 cores the loop runs on two callbacks per step, and a best-effort
listener may miss states under load. Rows: ``t`` (the state's stamp [s]), the body velocity as
odom carries it (``vx``, ``vy`` [m/s], ``wz`` [rad/s]), then joint positions [rad] and efforts
[N m] in the robot's joint order, ``q/<joint>`` and ``effort/<joint>``. Numpy only (the gate and
the sim node load without torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

BODY_COLUMNS = ('t', 'vx', 'vy', 'wz')
ROW_DIM = 'state'  # the label of the first dimension of the message (the second: the columns)
MAX_EPISODE_S = 600.0  # 12 MB of rows at most for a 12-joint robot at 50 Hz


def episode_steps(seconds: float, control_dt: float) -> int:
    """Control steps of an episode ``seconds`` long: the nearest whole number, at least one."""
    return max(1, round(seconds / control_dt))


def episode_columns(joint_names: Sequence[str]) -> tuple[str, ...]:
    """The column labels of a record of a robot with these joints (in spec order)."""
    return BODY_COLUMNS + tuple(f'q/{n}' for n in joint_names) + \
        tuple(f'effort/{n}' for n in joint_names)


class EpisodeRecorder:
    """Rows of one episode that began at sim step ``start_step`` and ends ``steps`` later
    (``end_step``), stored in a buffer sized for it (no allocation per step)."""

    def __init__(self, joint_names: Sequence[str], start_step: int, steps: int):
        self.columns = episode_columns(joint_names)
        self.end_step = start_step + steps
        self.rows = np.empty((max(1, steps + 1), len(self.columns)))  # + the reset state
        self.count = 0

    def add(self, t: float, lin_vel: np.ndarray, ang_vel: np.ndarray, joint_pos: np.ndarray,
            joint_effort: np.ndarray) -> None:
        """One published state: ``lin_vel``/``ang_vel`` [3] as odom's twist, joints [J]."""
        if self.count == len(self.rows):  # a longer episode than announced: grow, keep all
            self.rows = np.concatenate([self.rows, np.empty_like(self.rows)])
        row, j = self.rows[self.count], (len(self.columns) - 4) // 2
        row[0], row[1:3], row[3] = t, lin_vel[0:2], ang_vel[2]
        row[4:4 + j], row[4 + j:] = joint_pos, joint_effort
        self.count += 1

    def table(self) -> np.ndarray:
        """[T, C] the rows so far."""
        return self.rows[:self.count]


@dataclass(frozen=True)
class EpisodeTable:
    """A received record: ``t`` [T], ``velocity`` [T, 3] (vx, vy, wz), ``joint_pos`` and
    ``effort`` [T, J] in the order of ``joint_names``."""

    t: np.ndarray
    velocity: np.ndarray
    joint_pos: np.ndarray
    effort: np.ndarray
    joint_names: tuple[str, ...]


def read_episode(labels: Sequence[str], sizes: Sequence[int], data: np.ndarray,
                 joint_names: Sequence[str]) -> EpisodeTable:
    """The record from a message's dimension labels and sizes and its flat data, columns picked
    by name for the robot's ``joint_names`` (any order on the wire). ValueError naming what
    is wrong for a record that is not one (wrong layout, missing joint, size mismatch)."""
    if len(labels) != 2 or labels[0] != ROW_DIM:
        raise ValueError(f'episode record layout {list(labels)!r}; expected two dimensions, '
                         f'{ROW_DIM!r} then the column names')
    columns = labels[1].split(',')
    rows, width = int(sizes[0]), int(sizes[1])
    if width != len(columns) or data.size != rows * width:
        raise ValueError(f'episode record of {data.size} values for {rows} x {width} '
                         f'({len(columns)} column names): not a record')
    missing = [c for c in episode_columns(joint_names) if c not in columns]
    if missing:
        raise ValueError(f'episode record lacks columns {missing[:4]!r}: another robot?')
    table = np.asarray(data, dtype=np.float64).reshape(rows, width)
    index = {c: i for i, c in enumerate(columns)}

    def pick(names):
        return table[:, [index[n] for n in names]]
    return EpisodeTable(t=table[:, index['t']].copy(), velocity=pick(BODY_COLUMNS[1:]),
                        joint_pos=pick([f'q/{n}' for n in joint_names]),
                        effort=pick([f'effort/{n}' for n in joint_names]),
                        joint_names=tuple(joint_names))
