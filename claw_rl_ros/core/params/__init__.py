"""Node parameters: one dataclass per node, declared once for the nodes, the graph and the docs."""
