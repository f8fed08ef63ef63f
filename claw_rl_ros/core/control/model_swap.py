"""Validation of models offered for a hot swap, and a small cache of offered versions.

A model is activated only after every check passes: size cap, it parses as an ONNX policy
(:class:`OnnxPolicy`), its ``obs`` / ``actions`` shapes, its embedded robot spec equals the
robot's (every difference named), its ``action_clip`` metadata is a finite positive number
(the range the node clips actions and the last-action observation to, as the env did in
training), and finite actions of the right shape within that range on a probe batch.
A rejection raises :class:`ModelRejected` whose message is the exact reason; nothing changes
for the caller, so the old model keeps serving.
"""

from __future__ import annotations

from collections import OrderedDict
import hashlib
from pathlib import Path
import threading

import numpy as np

from ..export.onnx_policy import ModelError, OnnxPolicy, SpecMismatchError
from ..sim.robot_spec import RobotSpec

DEFAULT_MAX_MODEL_BYTES = 16 * 1024 * 1024
PROBE_BATCH = 64
VERSION_CHARS = 12


class ModelRejected(ValueError):
    """A model that must not be activated; the message is the reason given to the requester."""


class ModelNotReceived(ModelRejected):
    """Activation of a sha whose bytes have not arrived (yet): the trainer's push races its
    activation request, and retries; nothing is wrong with a model."""


def version_of(sha256: str) -> str:
    """The short version name of a model: its sha256 prefix."""
    return sha256[:VERSION_CHARS]


def probe_observations(obs_dim: int, seed: int = 0) -> np.ndarray:
    """[PROBE_BATCH, obs_dim] float32: zeros, then normal noise at row scales 0.3, 1 and 3."""
    rng = np.random.default_rng(seed)
    scale = rng.choice([0.3, 1.0, 3.0], size=(PROBE_BATCH, 1))
    obs = rng.standard_normal((PROBE_BATCH, obs_dim)) * scale
    obs[0] = 0.0
    return obs.astype(np.float32)


def policy_clip(policy: OnnxPolicy) -> float:
    """The trained action clip of a robot model (``action_clip`` metadata), or ModelRejected."""
    clip = policy.action_clip
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or \
            not (np.isfinite(clip) and clip > 0):
        raise ModelRejected(f'{policy.name}: action_clip metadata = {clip!r}; a robot model '
                            'needs one finite number > 0 (the env.clip_actions it was trained '
                            'with): re-export it with `claw-rl export`')
    return float(clip)


def validate_model(data: bytes, robot: RobotSpec,
                   max_bytes: int = DEFAULT_MAX_MODEL_BYTES,
                   name: str | None = None) -> OnnxPolicy:
    """The ready-to-run policy in ``data``, or ModelRejected with the exact reason (``name``:
    the model's path for messages, when it came from a file)."""
    if len(data) > max_bytes:
        raise ModelRejected(f'model is {len(data)} bytes, over the size cap of {max_bytes} '
                            'bytes (parameter max_model_bytes)')
    if len(data) == 0:
        raise ModelRejected('model is empty (0 bytes)')
    try:
        policy = OnnxPolicy(data, robot, name=name)
    except SpecMismatchError as exc:
        raise ModelRejected(f'spec mismatch: {exc}') from None
    except ModelError as exc:
        raise ModelRejected(f'invalid model: {exc}') from None
    except Exception as exc:  # noqa: BLE001 - malformed metadata fails in many ways
        raise ModelRejected(f'invalid model: {name or "<model bytes>"}: '
                            f'{type(exc).__name__}: {exc}') from None
    clip = policy_clip(policy)
    obs = probe_observations(policy.obs_dim)
    try:
        actions = np.asarray(policy(obs))
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises several kinds of error
        raise ModelRejected(f'probe run failed: {type(exc).__name__}: {exc}') from None
    if actions.shape != (PROBE_BATCH, robot.num_joints):
        raise ModelRejected(f'probe run gave actions of shape {actions.shape}, expected '
                            f'({PROBE_BATCH}, {robot.num_joints})')
    bad = np.argwhere(~np.isfinite(actions))
    if bad.size:
        row, col = (int(i) for i in bad[0])
        value = float(actions[row, col])
        raise ModelRejected(f'probe run gave a non-finite action ({value!r} for '
                            f'joint {robot.joint_names[col]} on probe row {row}); the model '
                            'is broken')
    # The graph clips to action_clip (export): an action beyond it says the metadata lies.
    beyond = float(np.abs(actions).max()) - clip
    if beyond > 1e-5 * max(1.0, clip):
        raise ModelRejected(f'probe run gave an action of {clip + beyond:.6g}, beyond the '
                            f'model\'s action_clip {clip:g}: its metadata does not describe '
                            'its graph; re-export it with `claw-rl export`')
    return policy


def read_model_file(path: str | Path, max_bytes: int = DEFAULT_MAX_MODEL_BYTES) -> bytes:
    """The bytes of a model file, or ModelRejected (missing, unreadable, over the cap)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise ModelRejected(f'{path} is {size} bytes, over the size cap of {max_bytes} '
                                'bytes (parameter max_model_bytes)')
        return path.read_bytes()
    except OSError as exc:
        raise ModelRejected(f'{path}: cannot read the model ({exc.strerror or exc}); give the '
                            'path of an exported .onnx file') from None


class ModelCache:
    """Offered models by sha256: the validated policy or the rejection reason (LRU, bounded).

    ``offer`` validates bytes as they arrive (off the activation path; thread-safe, so it may
    run on a worker thread); ``get`` returns the policy for a hash (full hex digest or a prefix
    of at least 8 characters) or raises ModelRejected with the stored reason.
    """

    def __init__(self, robot: RobotSpec, max_bytes: int = DEFAULT_MAX_MODEL_BYTES,
                 capacity: int = 4):
        self.robot = robot
        self.max_bytes = max_bytes
        self.capacity = capacity
        self._entries: OrderedDict[str, OnnxPolicy | ModelRejected] = OrderedDict()
        self._lock = threading.Lock()

    def offer(self, data: bytes, name: str | None = None
              ) -> tuple[str, OnnxPolicy | ModelRejected]:
        """Validate and remember ``data`` (``name``: its path, for messages); returns (sha256,
        policy or the rejection)."""
        sha = hashlib.sha256(data).hexdigest()
        with self._lock:
            known = self._entries.get(sha)
        if known is None:
            try:
                known = validate_model(data, self.robot, self.max_bytes, name)
            except ModelRejected as exc:
                known = exc
        with self._lock:
            self._entries[sha] = known
            self._entries.move_to_end(sha)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return sha, known

    def get(self, sha256: str) -> OnnxPolicy:
        """The validated policy offered with this hash, or ModelRejected saying why not."""
        key = sha256.strip().lower()
        if len(key) < 8:
            raise ModelRejected(f'model_sha256 {sha256!r} is too short; give at least 8 hex '
                                'characters of the sha256 of the bytes sent on policy/model')
        with self._lock:
            entries = dict(self._entries)
        hits = [s for s in entries if s.startswith(key)]
        if not hits:
            known = [version_of(s) for s in entries] or 'none'
            raise ModelNotReceived(f'no model with sha256 {sha256!r} was received on '
                                   f'policy/model (have {known}); publish the bytes first')
        if len(hits) > 1:
            raise ModelRejected(f'model_sha256 {sha256!r} matches {len(hits)} models; give '
                                'more characters')
        entry = entries[hits[0]]
        if isinstance(entry, ModelRejected):
            raise ModelRejected(str(entry))
        return entry
