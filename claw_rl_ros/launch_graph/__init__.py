"""One graph description for ``claw-rl up`` and ``ros2 launch`` (see graphs.GRAPHS)."""

from .description import (Argument, EXECUTABLES, Graph, NodeEntry, resolve, ResolvedNode,
                          ros_command)
from .graphs import GRAPHS

__all__ = ['Argument', 'EXECUTABLES', 'Graph', 'GRAPHS', 'NodeEntry', 'resolve',
           'ResolvedNode', 'ros_command']
