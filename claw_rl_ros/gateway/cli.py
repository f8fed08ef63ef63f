"""``claw-rl gateway ...`` sub-commands (placeholder until the gateway client lands)."""

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``gateway`` on the claw-rl parser."""
    gateway = subparsers.add_parser('gateway', help='check an OpenAI-compatible LLM gateway')
    gateway.set_defaults(func=lambda args: (print('gateway check: not built yet'), 1)[1])
