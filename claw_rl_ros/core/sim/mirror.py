"""The mirror's data types: signed permutations of vectors and the robot's derived mirror.

:class:`RobotMirror` is what :func:`~.symmetry.derive_mirror` finds for a robot (its joint and
foot permutations and gait shift); it maps actions and observation layouts to their mirror
images. Plain data over :mod:`.observations`' terms, so the robot spec can hold one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .observations import ObservationLayout, TERMS


@dataclass(frozen=True)
class SignedPermutation:
    """``y = x[..., index] * coef``: index [D] int64, coef [D] float32."""

    index: np.ndarray
    coef: np.ndarray

    @property
    def dim(self) -> int:
        return len(self.index)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """[..., D] -> [..., D] mirrored values."""
        return x[..., self.index] * self.coef

    @staticmethod
    def identity(dim: int) -> 'SignedPermutation':
        return SignedPermutation(np.arange(dim), np.ones(dim, np.float32))

    @staticmethod
    def concat(parts: list['SignedPermutation']) -> 'SignedPermutation':
        """One map over the concatenated vectors of ``parts`` (in order)."""
        index, coef, start = [], [], 0
        for part in parts:
            index.append(part.index + start)
            coef.append(part.coef)
            start += part.dim
        return SignedPermutation(np.concatenate(index).astype(np.int64) if index else
                                 np.zeros(0, np.int64),
                                 np.concatenate(coef).astype(np.float32) if coef else
                                 np.zeros(0, np.float32))


def _term_map(kind: str, size: int, mirror: RobotMirror) -> SignedPermutation:
    """The signed permutation of one term's raw (unscaled) values by its mirror kind."""
    if kind == 'polar':
        return SignedPermutation(np.arange(3), np.array([1, -1, 1], np.float32))
    if kind == 'axial':
        return SignedPermutation(np.arange(3), np.array([-1, 1, -1], np.float32))
    if kind == 'command':  # (vx, vy, yaw rate)
        return SignedPermutation(np.arange(3), np.array([1, -1, -1], np.float32))
    if kind == 'joints':
        return mirror.actions
    if kind == 'feet':
        return SignedPermutation(mirror.foot_index, np.ones(size, np.float32))
    if kind == 'phase':  # (sin, cos) of 2 pi (phase + 0.5) = -(sin, cos)
        sign = -1.0 if mirror.gait_shift else 1.0
        return SignedPermutation(np.arange(2), np.full(2, sign, np.float32))
    return SignedPermutation.identity(size)  # scalar


@dataclass(frozen=True)
class RobotMirror:
    """The derived mirror: joint_index / joint_sign [J], foot_index [F], gait_shift 0 or 0.5."""

    joint_index: np.ndarray
    joint_sign: np.ndarray
    foot_index: np.ndarray
    gait_shift: float

    @property
    def actions(self) -> SignedPermutation:
        """Mirror of [..., J] actions (and of any per-joint term)."""
        return SignedPermutation(self.joint_index, self.joint_sign.astype(np.float32))

    def layout(self, layout: ObservationLayout) -> SignedPermutation:
        """Mirror of a layout's scaled observation [..., dim]: per term by its kind, each
        element's coefficient times scale_k / scale_(index k) (scales of mirrored elements may
        differ; a zero scale only where its partner's is zero)."""
        parts = []
        for s in layout.slices:
            raw = _term_map(TERMS[s.name].mirror, s.size, self)
            src = s.scale[raw.index]
            if np.any((src == 0) & (s.scale != 0)):
                raise ValueError(f'observation group {layout.group!r}: term {s.name!r} scales '
                                 f'{s.scale.tolist()} give a mirrored element a zero scale; '
                                 'give mirrored elements scales that are both zero or both not')
            ratio = np.divide(s.scale, src, out=np.zeros_like(s.scale), where=src != 0)
            parts.append(SignedPermutation(raw.index, (raw.coef * ratio).astype(np.float32)))
        return SignedPermutation.concat(parts)
