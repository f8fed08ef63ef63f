"""The deployed student: an exported ONNX model run by onnxruntime on one thread.

The model carries the robot spec in its metadata (``claw_rl_spec``); given the robot it will
drive, :class:`OnnxPolicy` refuses a model made for another robot, joint order, gain set or
observation layout, naming every difference. A model trained on a Gymnasium task carries that
task's spec instead (``kind: gymnasium``: env id, observation and action spaces) and is checked
against a :class:`~..sim.gym_spec.GymTaskSpec` the same way. Only onnxruntime is needed (no
torch, no onnx).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, TYPE_CHECKING

import numpy as np

from ..sim.observations import check_history
from ..sim.robot_spec import METADATA_KEY, RobotSpec

if TYPE_CHECKING:
    import onnxruntime as ort

INPUT_NAME = 'obs'
OUTPUT_NAME = 'actions'


class ModelError(ValueError):
    """The file is not a usable claw_rl_ros policy model (missing, corrupt, no spec, bad I/O)."""


class SpecMismatchError(ModelError):
    """The model was exported for a robot spec that differs from the one it should drive."""


def session_options() -> ort.SessionOptions:
    """One intra-op and one inter-op thread, sequential: predictable latency next to ROS."""
    import onnxruntime as ort  # (when a model is loaded: the sim node imports this module)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


def _read(source: str | Path | bytes) -> tuple[bytes, str]:
    """(model bytes, a name for messages) from a path or from bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), '<model bytes>'
    path = Path(source)
    if not path.is_file():
        raise ModelError(f'{path}: model file not found; give an exported .onnx file')
    return path.read_bytes(), str(path)


class OnnxPolicy:
    """``actions = policy(obs)``: [obs_dim] -> [A] or [N, obs_dim] -> [N, A], float32.

    Attributes: ``spec`` (the robot or Gymnasium task spec dict from the metadata), ``kind``
    (``robot`` or ``gymnasium``), ``metadata`` (all metadata strings), ``obs_dim`` (the input
    size: ``obs_history`` frames of ``frame_dim``, oldest first; models exported before the
    history existed read one frame), ``num_actions``, ``action_clip`` (the trained action
    range: a float for +-clip, or ``{'low': [A], 'high': [A]}``), ``sha256`` (hex digest of
    the model bytes, the model's version name), ``name`` (path or ``<model bytes>``).
    """

    def __init__(self, source: str | Path | bytes, robot: RobotSpec | None = None,
                 name: str | None = None):
        data, self.name = _read(source)
        self.name = name or self.name  # bytes read from a file keep the file's name
        self.sha256 = hashlib.sha256(data).hexdigest()
        import onnxruntime as ort
        try:
            self._session = ort.InferenceSession(data, session_options(),
                                                 providers=['CPUExecutionProvider'])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises several kinds of error
            raise ModelError(f'{self.name}: not a loadable ONNX model ({_first_line(exc)})') \
                from None
        self.metadata = dict(self._session.get_modelmeta().custom_metadata_map)
        self.spec = self._read_spec()
        self.frame_dim = int(self.spec['obs_dim'])
        try:
            self.obs_history = check_history(self.spec.get('obs_history', 1), 'obs_history')
        except ValueError as exc:
            raise ModelError(f'{self.name}: {METADATA_KEY!r} metadata {exc}') from None
        self.obs_dim = self.frame_dim * self.obs_history
        self.num_actions = int(self.spec['action_dim'])
        # The action range the model was trained with (clipped inside the graph); None for
        # models exported before it was recorded.
        self.action_clip = self.spec.get('action_clip')
        self.kind = self.spec.get('kind', 'robot')
        self._check_io()
        if robot is not None:
            self.check_robot(robot)
        self._outputs = [OUTPUT_NAME]

    def _read_spec(self) -> dict[str, Any]:
        raw = self.metadata.get(METADATA_KEY)
        if raw is None:
            raise ModelError(f'{self.name}: no {METADATA_KEY!r} metadata, so its robot spec is '
                             'unknown; export the model with `claw-rl export`')
        try:
            spec = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ModelError(f'{self.name}: {METADATA_KEY!r} metadata is not JSON ({exc})') \
                from None
        if not isinstance(spec, dict) or not {'obs_dim', 'action_dim'} <= spec.keys():
            raise ModelError(f'{self.name}: {METADATA_KEY!r} metadata lacks obs_dim/action_dim')
        return spec

    def _check_io(self) -> None:
        """One float input ``obs`` [batch, obs_dim], an output ``actions`` [batch, A]."""
        inputs = self._session.get_inputs()
        outputs = {o.name: o for o in self._session.get_outputs()}
        if [i.name for i in inputs] != [INPUT_NAME] or OUTPUT_NAME not in outputs:
            raise ModelError(f'{self.name}: expected input {INPUT_NAME!r} and output '
                             f'{OUTPUT_NAME!r}, model has inputs {[i.name for i in inputs]} and '
                             f'outputs {list(outputs)}')
        for arg, dim in ((inputs[0], self.obs_dim), (outputs[OUTPUT_NAME], self.num_actions)):
            if arg.type != 'tensor(float)' or len(arg.shape) != 2 or arg.shape[1] != dim:
                raise ModelError(f'{self.name}: {arg.name!r} is {arg.type} {arg.shape}, the '
                                 f'spec metadata says tensor(float) [batch, {dim}]')

    def check_robot(self, robot: RobotSpec) -> None:
        """Raise :class:`SpecMismatchError` naming every difference from ``robot``'s spec.

        ``robot`` may also be a Gymnasium task spec (anything with ``name`` and
        ``mismatches(metadata) -> list[str]``).
        """
        problems = robot.mismatches(self.spec)
        if problems:
            what = 'robot' if self.kind == 'robot' else 'task'
            raise SpecMismatchError(
                f'{self.name} was exported for a different {what} spec than {robot.name!r} '
                f'({len(problems)} mismatch(es)): ' + '; '.join(problems)
                + overlay_hint(robot, self.spec, problems))

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """[obs_dim] or [N, obs_dim] observations -> [A] or [N, A] float32 actions."""
        x = np.asarray(obs, dtype=np.float32)
        single = x.ndim == 1
        if single:
            x = x[None]
        if x.ndim != 2 or x.shape[1] != self.obs_dim:
            raise ValueError(f'observation shape {tuple(np.shape(obs))}: expected '
                             f'[{self.obs_dim}] or [N, {self.obs_dim}]')
        if not np.isfinite(x).all():
            bad = np.argwhere(~np.isfinite(x))[0]
            raise ValueError(f'observation has a non-finite value (first at index '
                             f'{tuple(int(i) for i in bad)}); refusing to act on it')
        actions = self._session.run(self._outputs, {INPUT_NAME: x})[0]
        return actions[0] if single else actions


def overlay_hint(robot: Any, spec: dict[str, Any], problems: list[str]) -> str:
    """'' unless the gains differ; then which robot overlay the model was trained with and
    which the robot has (a model trained on an overlay needs the same one)."""
    if not any(p.startswith(('kp:', 'kd:')) for p in problems):
        return ''
    trained = spec.get('robot_overlay')
    sha = str(trained.get('sha256') or '?')[:12] if isinstance(trained, dict) else '?'
    mine = getattr(robot, 'source', {}).get('overlay', '')
    if trained and mine:
        return (f'; hint: the model was trained with the robot overlay of sha256 {sha}, this '
                f'robot has {mine}: give the model\'s as robot_overlay (--robot-overlay)')
    if trained:
        return (f'; hint: the model was trained with a robot overlay (sha256 {sha}; its run '
                'directory\'s robot_overlay.yaml): give the same as robot_overlay '
                '(--robot-overlay)')
    if mine:
        return (f'; hint: this robot has the robot overlay {mine} and the model was trained '
                'without one: leave robot_overlay (--robot-overlay) empty')
    return ('; hint: a model trained with a robot overlay (claw-rl train --robot-overlay) '
            'needs the same robot_overlay (--robot-overlay) here')


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f'{type(exc).__name__}: {text[0] if text else ""}'
