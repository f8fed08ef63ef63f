"""``claw-rl export``: a training checkpoint -> a verified ONNX student and its policy card.

User mistakes (missing file, no checkpoint, a model for another robot spec) become a
ConfigError: one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json

from ..core.config import ConfigError


def _cmd_export(args: argparse.Namespace) -> int:
    from ..core.learning import checkpoint
    from ..core.export.onnx_export import export_checkpoint, ExportError
    from ..core.export.onnx_policy import OnnxPolicy
    from ..core.export.policy_card import write_policy_card
    source = args.checkpoint
    if args.run_dir is not None:
        source = checkpoint.latest_checkpoint(args.run_dir)
        if source is None:
            raise ConfigError(args.run_dir, '', 'no checkpoints/model_*.pt in this run '
                              'directory; give --checkpoint or another --run-dir')
        from ..core.evaluation.selection import picked_snapshot
        picked = picked_snapshot(args.run_dir)
        if picked is not None:
            print(f'note: this run\'s student.onnx is the student runner.selection picked '
                  f'({picked}); exporting the newest checkpoint, the final student '
                  f'({source.name}). Give --checkpoint {picked} for the picked one.')
    try:
        path = export_checkpoint(source, args.out)
    except ConfigError:
        raise
    except (ValueError, ExportError) as exc:
        raise ConfigError(str(source), '', str(exc)) from None
    model = OnnxPolicy(path)
    # The card documents a robot deployment (joints, gains, control period); task models
    # (Gymnasium) describe themselves in their metadata only.
    card = write_policy_card(path) if model.kind == 'robot' else None
    print(f'exported {source} -> {path}')
    print(f'  sha256 {model.sha256}')
    target = f'robot {model.spec.get("robot")!r}' if model.kind == 'robot' else \
        f'Gymnasium env {model.spec.get("env_id")!r}'
    print(f'  obs [batch, {model.obs_dim}] -> actions [batch, {model.num_actions}], {target}, '
          f'algorithm {json.loads(model.metadata.get("algorithm", "null"))}')
    print(f'  max abs diff onnxruntime vs torch: {model.metadata["parity_max_abs_diff"]} '
          f'({model.metadata.get("parity_max_scaled_diff", "?")} per unit of activation scale)')
    if card is not None:
        print(f'  policy card {card}')
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``export`` on the claw-rl parser."""
    export = subparsers.add_parser('export', help='export a checkpoint\'s student to ONNX '
                                   '(normaliser and robot or Gymnasium task spec inside, '
                                   'parity-checked)')
    source = export.add_mutually_exclusive_group(required=True)
    source.add_argument('--checkpoint', help='a training checkpoint (.pt)')
    source.add_argument('--run-dir', help='a run directory: export its latest checkpoint')
    export.add_argument('--out', default='student.onnx', help='ONNX file to write')
    export.set_defaults(func=_cmd_export)
