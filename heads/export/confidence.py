"""The confidence head travels beside a drafter as its own files, which engines ignore.

A head directory that holds `confidence.safetensors` + `confidence_config.json` (written by
the confidence head, heads/confidence.py) gets both copied byte for byte into every export,
and the exported config's "drafter" section records their sha256.
"""

import json
import shutil
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from heads.target import sha256_file

CONFIDENCE_WEIGHTS = "confidence.safetensors"
CONFIDENCE_CONFIG = "confidence_config.json"


def confidence_files(head_dir: Path) -> tuple[Path, Path] | None:
    """The two files, or None; one without the other is an error."""
    weights, config = head_dir / CONFIDENCE_WEIGHTS, head_dir / CONFIDENCE_CONFIG
    if weights.is_file() != config.is_file():
        present = weights if weights.is_file() else config
        raise ValueError(
            f"{present}: the confidence head needs both {CONFIDENCE_WEIGHTS} and {CONFIDENCE_CONFIG}"
        )
    return (weights, config) if weights.is_file() else None


def copy_confidence(head_dir: Path, out_dir: Path) -> dict[str, Any] | None:
    """Copy the confidence files (after checking they read) and return the config record."""
    files = confidence_files(head_dir)
    if files is None:
        return None
    weights, config = files
    if not load_file(str(weights)):
        raise ValueError(f"{weights}: holds no tensors")
    json.loads(config.read_text())
    for path in files:
        shutil.copyfile(path, out_dir / path.name)
    return {
        "weights": CONFIDENCE_WEIGHTS,
        "config": CONFIDENCE_CONFIG,
        "sha256": {path.name: sha256_file(path) for path in files},
    }


def check_confidence(out_dir: Path, record: dict[str, Any] | None) -> None:
    """The copies in an export are the recorded bytes."""
    if record is None:
        if confidence_files(out_dir) is not None:
            raise ValueError(f"{out_dir}: confidence files present but not recorded in config.json")
        return
    for name, digest in record["sha256"].items():
        path = out_dir / name
        if not path.is_file() or sha256_file(path) != digest:
            raise ValueError(f"{path}: missing or not the confidence file that was exported")
