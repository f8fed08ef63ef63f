"""``claw-rl export`` and ``claw-rl eval`` (being built)."""

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register export and eval on the claw-rl parser (none yet)."""
