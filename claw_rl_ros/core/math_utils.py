"""Batched quaternion helpers (MuJoCo convention: w, x, y, z), numpy only."""

from __future__ import annotations

import numpy as np


def _rotate(quat: np.ndarray, vec: np.ndarray, sign: float) -> np.ndarray:
    w = quat[:, 0:1]
    q_vec = quat[:, 1:4]
    vec = np.broadcast_to(vec, q_vec.shape)
    # v' = v (2w^2 - 1) +- 2w (q x v) + 2 q (q . v); minus rotates by the inverse quaternion.
    a = vec * (2.0 * w * w - 1.0)
    # q x v written out: np.cross's axis handling costs ~100 us per call, a control tick's
    # budget on the policy node (same products and differences, so the same bits).
    qx, qy, qz = q_vec[:, 0:1], q_vec[:, 1:2], q_vec[:, 2:3]
    vx, vy, vz = vec[:, 0:1], vec[:, 1:2], vec[:, 2:3]
    cross = np.concatenate([qy * vz - qz * vy, qz * vx - qx * vz, qx * vy - qy * vx], axis=1)
    b = cross * (2.0 * w)
    c = q_vec * (2.0 * np.sum(q_vec * vec, axis=1, keepdims=True))
    return a + sign * b + c


def quat_rotate_inverse(quat: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """Rotate world vectors into the body frame: R(q)^T v.

    Args:
        quat: [N, 4] unit quaternions (w, x, y, z), body -> world.
        vec: [N, 3] or [3] world-frame vectors.

    Returns:
        [N, 3] body-frame vectors.
    """
    return _rotate(quat, vec, -1.0)


def quat_rotate(quat: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """Rotate body vectors into the world frame: R(q) v. Shapes as quat_rotate_inverse."""
    return _rotate(quat, vec, 1.0)


def yaw_quat(yaw: np.ndarray) -> np.ndarray:
    """[N] yaw angles -> [N, 4] quaternions about +z."""
    half = 0.5 * np.asarray(yaw, dtype=np.float64)
    out = np.zeros((half.shape[0], 4))
    out[:, 0] = np.cos(half)
    out[:, 3] = np.sin(half)
    return out


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product of [N, 4] quaternions a * b."""
    aw, ax, ay, az = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    bw, bx, by, bz = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    return np.stack([
        aw * bw - ax * bx - ay * by - az * bz,
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
    ], axis=1)


def gravity_in_body(quat: np.ndarray) -> np.ndarray:
    """[N, 4] base orientation -> [N, 3] unit gravity direction in the body frame."""
    down = np.array([0.0, 0.0, -1.0])
    return quat_rotate_inverse(quat, down)
