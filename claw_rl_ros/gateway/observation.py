"""A text summary of one robot observation, to ask teacher and student LLMs the same question.

The layout (term names, sizes, scales, joint names) comes from an exported model's metadata or
from the robot config; the values from a recorded observation file or a short simulation. The
summary shows every term unscaled, in physical units, and asks for a one-sentence description
of the robot's posture and motion.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence

from .errors import GatewayConfigError

DEFAULT_QUESTION = "In one sentence, describe the robot's posture and motion."
DEFAULT_SIM_STEPS = 25
_VECTOR_AXES = {'velocity_commands': ('vx', 'vy', 'yaw_rate')}


def robot_metadata(robot: str = 'claw_quadruped') -> dict:
    """The robot spec (as written into exported models) from the robot config."""
    from ..core.config import ConfigError
    from ..core.sim.robot import load_robot
    try:
        return load_robot(robot).to_metadata()
    except (ConfigError, OSError) as exc:
        raise GatewayConfigError(f'robot {robot!r}: {exc}',
                                 'pass --robot with a name from config/robots/ or a YAML path'
                                 ) from None


def model_metadata(path: str | Path) -> dict:
    """The robot spec stored in an exported ONNX model's ``metadata_props``."""
    from ..core.sim.robot_spec import METADATA_KEY
    path = Path(path)
    again = 'export the model again with claw-rl export'
    if not path.is_file():
        raise GatewayConfigError(f'model file {path} (--model) does not exist',
                                 'pass the path of an exported .onnx model, or drop --model to '
                                 'use the robot config')
    try:
        import onnx
        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False)
                 .metadata_props}
    except ImportError:
        raise GatewayConfigError('reading --model needs the onnx package, which is not '
                                 'installed', 'pip install -r requirements.txt') from None
    except Exception as exc:  # noqa: BLE001 - onnx raises several types for a bad file
        raise GatewayConfigError(f'{path} is not a readable ONNX model ({type(exc).__name__})',
                                 'pass a model written by claw-rl export') from None
    if METADATA_KEY not in props:
        raise GatewayConfigError(f'{path} has no {METADATA_KEY!r} metadata entry',
                                 f'{again}, or drop --model to use the robot config')
    try:
        return check_metadata(json.loads(props[METADATA_KEY]), str(path))
    except json.JSONDecodeError as exc:
        raise GatewayConfigError(f'{path}: metadata {METADATA_KEY!r} is not valid JSON '
                                 f'({exc.msg})', again) from None


def check_metadata(meta: Any, source: str) -> dict:
    """Validate the parts of a spec the summary uses: robot, joints, observation layout."""
    def bad(problem: str) -> GatewayConfigError:
        return GatewayConfigError(f'{source}: {problem}', 'export the model again with this '
                                  'version of claw-rl')
    if not isinstance(meta, dict):
        raise bad('robot spec is not a JSON object')
    missing = [k for k in ('robot', 'joint_names', 'observation', 'obs_dim') if k not in meta]
    if missing:
        raise bad(f'robot spec has no {missing[0]!r}')
    terms = meta['observation']
    if not isinstance(terms, list) or not terms:
        raise bad('robot spec has an empty observation layout')
    for term in terms:
        if not (isinstance(term, dict) and isinstance(term.get('name'), str)
                and isinstance(term.get('size'), int) and isinstance(term.get('scale'), list)
                and len(term['scale']) == term['size']):
            raise bad(f'observation term {term!r} is malformed')
    total = sum(t['size'] for t in terms)
    if total != meta['obs_dim']:
        raise bad(f'observation terms add up to {total} values but obs_dim is '
                  f'{meta["obs_dim"]}')
    return meta


def load_state(path: str | Path, meta: dict) -> list[float]:
    """A recorded observation as the policy input (scaled), from a JSON file.

    Two forms: a list of ``obs_dim`` numbers (the scaled policy input, as recorded; a
    ``[1, obs_dim]`` list is accepted too), or an object mapping each term name to its values in
    physical units (unscaled), e.g. ``{"joint_pos": [...], "base_ang_vel": [0, 0, 0], ...}``.
    """
    path = Path(path)
    hint = ('write a JSON list of obs_dim numbers, or an object {term name: [values]} with the '
            'terms ' + ', '.join(f'{t["name"]}[{t["size"]}]' for t in meta['observation']))
    try:
        data = json.loads(path.read_text(encoding='utf-8'))
    except OSError as exc:
        raise GatewayConfigError(f'state file {path} (--state) cannot be read '
                                 f'({exc.strerror})', hint) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GatewayConfigError(f'state file {path} is not valid JSON ({exc})', hint) from None
    dim = meta['obs_dim']
    if isinstance(data, list) and len(data) == 1 and isinstance(data[0], list):
        data = data[0]
    if isinstance(data, list):
        if len(data) != dim:
            raise GatewayConfigError(f'state file {path} has {len(data)} values; the model '
                                     f'expects obs_dim = {dim}', hint)
        return [_number(v, f'{path}[{i}]', hint) for i, v in enumerate(data)]
    if not isinstance(data, dict):
        raise GatewayConfigError(f'state file {path} holds a {type(data).__name__}', hint)
    names = [t['name'] for t in meta['observation']]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise GatewayConfigError(f'state file {path}: {unknown[0]!r} is not an observation term '
                                 f'of {meta["robot"]}', hint)
    scaled: list[float] = []
    for term in meta['observation']:
        name, size = term['name'], term['size']
        if name not in data:
            raise GatewayConfigError(f'state file {path} has no values for term {name!r}', hint)
        values = data[name] if isinstance(data[name], list) else [data[name]]
        if len(values) != size:
            raise GatewayConfigError(f'state file {path}: term {name!r} has {len(values)} '
                                     f'values; it needs {size}', hint)
        scaled += [_number(v, f'{path}: {name}[{i}]', hint) * s
                   for i, (v, s) in enumerate(zip(values, term['scale']))]
    return scaled


def _number(value: Any, where: str, hint: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise GatewayConfigError(f'{where} is {value!r}, not a finite number', hint)
    return float(value)


def simulate_state(meta: dict, robot: Optional[str] = None, steps: int = DEFAULT_SIM_STEPS,
                   seed: int = 0) -> list[float]:
    """The policy observation after ``steps`` zero-action control steps from a seeded reset."""
    import numpy as np
    from ..core.config import ConfigError
    from ..core.sim.env import VecLocomotionEnv
    from ..core.sim.env_config import EnvConfig
    name = robot or meta['robot']
    try:
        env = VecLocomotionEnv(EnvConfig(robot=name, num_envs=1, seed=seed, num_threads=1))
    except (ConfigError, OSError, ValueError) as exc:
        raise GatewayConfigError(f'cannot simulate robot {name!r}: {exc}',
                                 'pass --robot with a robot config, or --state with a recorded '
                                 'observation') from None
    try:
        layout = [(s.name, s.size) for s in env.robot.policy_obs.slices]
        expected = [(t['name'], t['size']) for t in meta['observation']]
        if layout != expected:
            raise GatewayConfigError(
                f'the simulated robot {name!r} has the observation layout {layout}, but the '
                f'model expects {expected}', 'pass --robot with the robot the model was '
                'trained for, or --state with a recorded observation')
        obs, _ = env.reset(seed=seed)
        for _ in range(steps):
            obs, *_ = env.step(np.zeros((1, env.num_actions)))
        return [float(v) for v in obs['policy'][0]]
    finally:
        env.close()


def summarize(meta: dict, observation: Sequence[float], source: str,
              question: str = DEFAULT_QUESTION) -> str:
    """The prompt text: robot, joints, every term unscaled with units, and the question."""
    from ..core.sim.observations import TERMS
    joints = list(meta['joint_names'])
    lines = [
        'Below is one observation of a legged robot, exactly as its control policy receives '
        'it, converted back to physical units.',
        f'Robot: {meta["robot"]}, {len(joints)} actuated joints in this order: '
        f'{", ".join(joints)}.',
    ]
    if 'control_dt' in meta:
        lines.append(f'Control period: {float(meta["control_dt"]):g} s.')
    lines += [f'Source of the values: {source}.', 'Observation terms:']
    values: dict[str, list[float]] = {}
    start = 0
    for term in meta['observation']:
        name, size = term['name'], term['size']
        raw = observation[start:start + size]
        start += size
        unscaled = [v / s if s else v for v, s in zip(raw, term['scale'])]
        values[name] = unscaled
        doc = TERMS[name].doc if name in TERMS else 'policy input'
        labels = _labels(name, size, joints)
        shown = ', '.join(f'{label}={v:+.3f}' for label, v in zip(labels, unscaled))
        lines.append(f'- {name} ({doc}): {shown}')
    lines += _derived(values, meta)
    lines.append(f'Question: {question}')
    return '\n'.join(lines)


def _labels(name: str, size: int, joints: list[str]) -> list[str]:
    if name in _VECTOR_AXES and size == len(_VECTOR_AXES[name]):
        return list(_VECTOR_AXES[name])
    if size == len(joints):
        return [j[:-6] if j.endswith('_joint') else j for j in joints]
    if size == 3:
        return ['x', 'y', 'z']
    return [str(i) for i in range(size)]


def _derived(values: dict[str, list[float]], meta: dict) -> list[str]:
    """A few plain-language numbers: trunk tilt and absolute joint angles."""
    lines = []
    gravity = values.get('projected_gravity')
    if gravity and len(gravity) == 3:
        norm = math.sqrt(sum(g * g for g in gravity)) or 1.0
        tilt = math.degrees(math.acos(max(-1.0, min(1.0, -gravity[2] / norm))))
        lines.append(f'Derived: trunk tilt from upright {tilt:.1f} deg '
                     '(from projected_gravity; 0 = level).')
    offsets = values.get('joint_pos')
    default = meta.get('default_joint_pos')
    if offsets and isinstance(default, list) and len(default) == len(offsets):
        joints = _labels('joint_pos', len(offsets), list(meta['joint_names']))
        shown = ', '.join(f'{j}={q + d:+.3f}' for j, q, d in zip(joints, offsets, default))
        lines.append(f'Derived: absolute joint angles [rad]: {shown}.')
    return lines


def observation_prompt(model: Optional[str] = None, state: Optional[str] = None,
                       robot: Optional[str] = None, steps: int = DEFAULT_SIM_STEPS,
                       seed: int = 0, question: Optional[str] = None) -> tuple[str, str]:
    """Return (prompt, one-line description of where spec and values came from)."""
    if model:
        meta = model_metadata(model)
        spec_source = f'spec from {model}'
    else:
        meta = check_metadata(robot_metadata(robot or 'claw_quadruped'),
                              robot or 'claw_quadruped')
        spec_source = f'spec of robot {meta["robot"]}'
    if state:
        observation = load_state(state, meta)
        source = f'recorded observation {Path(state).name}'
    else:
        observation = simulate_state(meta, robot, steps=steps, seed=seed)
        source = (f'simulation, {steps} control steps of zero action after a reset with seed '
                  f'{seed}')
    prompt = summarize(meta, observation, source, question or DEFAULT_QUESTION)
    return prompt, f'observation summary ({spec_source}; {source})'
