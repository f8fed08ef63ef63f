"""Sub-commands of ``claw-rl``; each module has ``add_parser(subparsers)``."""
