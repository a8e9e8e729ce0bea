"""Existing drafters into our heads, so eval/ measures them and training continues from them.

The same reader that validates our exports (layouts.read_layout) loads them: the engine's
published table, then our head rebuilt for the given target (its embedding and lm_head are
the ones the engines share in too). A kind the format name alone does not pin down (vllm
holds EAGLE-3, EAGLE-1 and Medusa) is read from the config's architectures.
"""

from pathlib import Path

from torch import nn

from heads.export.confidence import import_confidence
from heads.export.formats import detect_kind, layout_for
from heads.export.layouts import TargetWeights, read_config, read_layout


def import_head(
    path: str | Path, format_name: str, target: TargetWeights, kind: str | None = None
) -> nn.Module:
    """One of our heads, built from an engine-format drafter directory."""
    path = Path(path)
    kind = kind or detect_kind(read_config(path), format_name, str(path))
    return read_layout(path, layout_for(kind, format_name), target.for_export())


def import_to_head_dir(
    path: str | Path, format_name: str, target: TargetWeights, out_dir: str | Path, kind: str | None = None
) -> Path:
    """Import and save in our own format (heads/registry.py); confidence files come along."""
    head = import_head(path, format_name, target, kind)
    out_dir = Path(out_dir)
    head.save_pretrained(out_dir)
    import_confidence(Path(path), out_dir)
    return out_dir
