"""``claw-rl train`` (being built)."""

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register train on the claw-rl parser (none yet)."""
