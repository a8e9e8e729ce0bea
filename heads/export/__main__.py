"""Command line for export and import.

    python -m heads.export --head <dir> --target <name> --format sglang --out <dir> [--verdict <verdict.json>] [--force]
    python -m heads.export import --format speculators --path <dir> --target <name> --out <our head dir> [--kind eagle3]

--target is what target.name takes in the job (embedded name, model dir, hub id or .gguf).
"""

import argparse
import logging
import sys
from pathlib import Path

from eval.config import EvalConfig
from heads.export.config import ExportConfig
from heads.export.formats import layout_for
from heads.export.importer import import_to_head_dir
from heads.export.job import drafter_meta, export_head, gate
from heads.export.layouts import TargetWeights
from heads.registry import load_head, read_head_config
from heads.target import Target, TargetConfig


def _export_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m heads.export", description="Export a trained head, validated."
    )
    parser.add_argument(
        "--head", required=True, type=Path, help="our head directory (head_config.json + model.safetensors)"
    )
    parser.add_argument("--target", required=True, help="the target, as target.name in the job config")
    parser.add_argument(
        "--format",
        required=True,
        help="sglang | vllm | speculators (EAGLE-3); vllm (EAGLE-1, Medusa); medusa; speculators (DFlash)",
    )
    parser.add_argument("--out", required=True, type=Path, help="the export directory to write")
    parser.add_argument(
        "--verdict", type=Path, help="the eval's verdict.json on this head, which gates the export"
    )
    parser.add_argument(
        "--min-acceptance-length",
        type=float,
        default=ExportConfig.min_acceptance_length,
        help="an AL floor every task must reach (default: beat the break-even the eval measured)",
    )
    parser.add_argument(
        "--draft-length",
        type=int,
        default=EvalConfig.draft_length,
        help="K to serve with when the verdict does not give one",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="export below the gate or without a verdict (recorded in the card and gate.json)",
    )
    parser.add_argument(
        "--local-verifier",
        action="store_true",
        help="name the target's local directory as the verifier (speculators layout, offline use)",
    )
    return parser


def _import_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m heads.export import", description="Import an engine-format drafter."
    )
    parser.add_argument("--format", required=True, help="sglang | vllm | speculators | medusa")
    parser.add_argument(
        "--path", required=True, type=Path, help="the drafter directory (config.json + weights)"
    )
    parser.add_argument("--target", required=True, help="the target, as target.name in the job config")
    parser.add_argument("--out", required=True, type=Path, help="our head directory to write")
    parser.add_argument("--kind", help="eagle3 | eagle1 | medusa | dflash, when the config does not say")
    return parser


def export_main(argv: list[str]) -> Path:
    args = _export_parser().parse_args(argv)
    layout = layout_for(read_head_config(args.head)["kind"], args.format)
    decision = gate(
        args.verdict, args.head, args.min_acceptance_length, args.force, "--min-acceptance-length", "--force"
    )
    target = Target.load(TargetConfig(name=args.target))
    weights = TargetWeights.from_target(target).for_export()
    head = load_head(
        args.head,
        embed_weight=weights.embed_weight,
        lm_head_weight=weights.lm_head_weight,
        target_config=target.config,
    )
    meta = drafter_meta(args.target, target, args.draft_length, decision, args.local_verifier)
    return export_head(head, layout, args.out, meta, weights, args.head)


def import_main(argv: list[str]) -> Path:
    args = _import_parser().parse_args(argv)
    target = TargetWeights.from_target(Target.load(TargetConfig(name=args.target)))
    return import_to_head_dir(args.path, args.format, target, args.out, args.kind)


def main(argv: list[str] | None = None) -> Path:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if argv[:1] == ["import"]:
        return import_main(argv[1:])
    return export_main(argv)


if __name__ == "__main__":
    try:
        print(main())
    except ValueError as error:
        sys.exit(f"error: {error}")
