"""URDF reading and ``check_urdf``-style validation (plain XML, no ROS needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
import xml.etree.ElementTree as ET

import numpy as np

ACTUATED_TYPES = ('revolute', 'prismatic', 'continuous')
JOINT_TYPES = ACTUATED_TYPES + ('fixed', 'floating', 'planar')


class UrdfError(ValueError):
    """The URDF is malformed; the message lists every problem found."""


@dataclass
class UrdfJoint:
    """One URDF joint with its limits (NaN where the URDF gives none)."""

    name: str
    type: str
    parent: str
    child: str
    axis: tuple[float, float, float] = (1.0, 0.0, 0.0)
    lower: float = float('nan')
    upper: float = float('nan')
    effort: float = float('nan')
    velocity: float = float('nan')


@dataclass
class UrdfModel:
    """Links (name -> mass, 0 if no inertial), joints by name, and the root link."""

    name: str
    links: dict[str, float] = field(default_factory=dict)
    joints: dict[str, UrdfJoint] = field(default_factory=dict)
    root: str = ''

    @property
    def total_mass(self) -> float:
        return float(sum(self.links.values()))


def _floats(text: str | None, n: int, default: float = 0.0) -> list[float]:
    if text is None:
        return [default] * n
    values = [float(v) for v in text.split()]
    if len(values) != n:
        raise ValueError(f'expected {n} numbers, got {text!r}')
    return values


def _attr(elem: ET.Element | None, name: str) -> float:
    if elem is None or elem.get(name) is None:
        return float('nan')
    return float(elem.get(name))


def check_urdf(path: str | Path) -> tuple[UrdfModel, list[str]]:
    """Parse a URDF and list its problems (an empty list means valid), like ``check_urdf``."""
    problems: list[str] = []
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        return UrdfModel(name=''), [f'cannot parse {path}: {exc}']
    if root.tag != 'robot' or not root.get('name'):
        problems.append('root element must be <robot name="...">')
    model = UrdfModel(name=root.get('name', ''))
    for link in root.findall('link'):
        name = link.get('name')
        if not name:
            problems.append('a <link> has no name')
            continue
        if name in model.links:
            problems.append(f'link {name!r} is defined twice')
        model.links[name] = _check_inertial(link, problems)
    for joint in root.findall('joint'):
        parsed = _parse_joint(joint, model, problems)
        if parsed is not None:
            model.joints[parsed.name] = parsed
    _check_tree(model, problems)
    return model, problems


def load_urdf(path: str | Path) -> UrdfModel:
    """Parse and validate; raise :class:`UrdfError` listing all problems."""
    model, problems = check_urdf(path)
    if problems:
        raise UrdfError(f'{path}: invalid URDF:\n  - ' + '\n  - '.join(problems))
    return model


def _check_inertial(link: ET.Element, problems: list[str]) -> float:
    name = link.get('name')
    inertial = link.find('inertial')
    if inertial is None:
        return 0.0
    mass_elem, inertia = inertial.find('mass'), inertial.find('inertia')
    mass = _attr(mass_elem, 'value')
    if not mass > 0:
        problems.append(f'link {name!r}: mass must be > 0, got {mass}')
        return 0.0
    if inertia is None:
        problems.append(f'link {name!r}: <inertial> has no <inertia>')
        return mass
    keys = ('ixx', 'ixy', 'ixz', 'iyy', 'iyz', 'izz')
    ixx, ixy, ixz, iyy, iyz, izz = (_attr(inertia, k) for k in keys)
    tensor = np.array([[ixx, ixy, ixz], [ixy, iyy, iyz], [ixz, iyz, izz]])
    if not np.all(np.isfinite(tensor)):
        problems.append(f'link {name!r}: inertia needs all of {", ".join(keys)}')
        return mass
    # A physical inertia is positive definite and its principal moments obey the triangle rule.
    moments = np.linalg.eigvalsh(tensor)
    if moments[0] <= 0:
        problems.append(f'link {name!r}: inertia is not positive definite (moments {moments})')
    elif moments[0] + moments[1] < moments[2] * (1 - 1e-6):
        problems.append(f'link {name!r}: principal moments {moments} break the triangle rule')
    return mass


def _parse_joint(joint: ET.Element, model: UrdfModel, problems: list[str]) -> UrdfJoint | None:
    name, kind = joint.get('name'), joint.get('type')
    if not name:
        problems.append('a <joint> has no name')
        return None
    if name in model.joints:
        problems.append(f'joint {name!r} is defined twice')
    if kind not in JOINT_TYPES:
        problems.append(f'joint {name!r}: unknown type {kind!r}')
        return None
    parent, child = joint.find('parent'), joint.find('child')
    out = UrdfJoint(name=name, type=kind,
                    parent=parent.get('link', '') if parent is not None else '',
                    child=child.get('link', '') if child is not None else '')
    for end, link in (('parent', out.parent), ('child', out.child)):
        if link not in model.links:
            problems.append(f'joint {name!r}: {end} link {link!r} does not exist')
    axis = joint.find('axis')
    try:
        out.axis = tuple(_floats(axis.get('xyz') if axis is not None else None, 3, 0.0)) \
            if axis is not None else (1.0, 0.0, 0.0)
    except ValueError as exc:
        problems.append(f'joint {name!r}: axis {exc}')
    if kind in ACTUATED_TYPES and not np.linalg.norm(out.axis) > 0:
        problems.append(f'joint {name!r}: axis must be non-zero')
    limit = joint.find('limit')
    out.lower, out.upper = _attr(limit, 'lower'), _attr(limit, 'upper')
    out.effort, out.velocity = _attr(limit, 'effort'), _attr(limit, 'velocity')
    if kind in ('revolute', 'prismatic'):
        if limit is None:
            problems.append(f'joint {name!r}: {kind} joints need a <limit>')
        elif not out.lower < out.upper:
            problems.append(f'joint {name!r}: limit lower={out.lower} must be < upper={out.upper}')
    if kind in ACTUATED_TYPES:
        if not out.effort > 0:
            problems.append(f'joint {name!r}: limit effort must be > 0, got {out.effort}')
        if not out.velocity > 0:
            problems.append(f'joint {name!r}: limit velocity must be > 0, got {out.velocity}')
    return out


def _check_tree(model: UrdfModel, problems: list[str]) -> None:
    parents: dict[str, str] = {}
    for joint in model.joints.values():
        if joint.child in parents:
            problems.append(f'link {joint.child!r} has two parent joints')
        parents[joint.child] = joint.parent
    roots = [link for link in model.links if link not in parents]
    if len(roots) != 1:
        problems.append(f'expected exactly one root link, found {roots}')
        return
    model.root = roots[0]
    for link in model.links:
        seen, node = set(), link
        while node in parents:
            if node in seen:
                problems.append(f'joint loop through link {link!r}')
                return
            seen.add(node)
            node = parents[node]
