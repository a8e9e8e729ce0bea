"""The confidence head travels with a drafter's export in a folder that engines never read.

vLLM loads every `*.safetensors` at the top of a drafter directory (and stops on the
confidence head's `linear.*` keys); no engine loader looks below it. So a head directory
that holds `confidence.safetensors` + `confidence_config.json` (written by the confidence
head, heads/confidence.py) gets both copied byte for byte into `<export>/confidence/`, and
the exported config's "drafter" section records their paths and sha256.
"""

import json
import shutil
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from heads.target import sha256_file

CONFIDENCE_WEIGHTS = "confidence.safetensors"
CONFIDENCE_CONFIG = "confidence_config.json"
EXPORT_FOLDER = "confidence"  # inside an export directory


def confidence_files(directory: Path) -> tuple[Path, Path] | None:
    """The two files in `directory`, or None; one without the other is an error."""
    weights, config = directory / CONFIDENCE_WEIGHTS, directory / CONFIDENCE_CONFIG
    if weights.is_file() != config.is_file():
        present = weights if weights.is_file() else config
        raise ValueError(
            f"{present}: the confidence head needs both {CONFIDENCE_WEIGHTS} and {CONFIDENCE_CONFIG}"
        )
    return (weights, config) if weights.is_file() else None


def _copy_checked(files: tuple[Path, Path], destination: Path) -> None:
    """Copy both files after checking they read."""
    weights, config = files
    if not load_file(str(weights)):
        raise ValueError(f"{weights}: holds no tensors")
    json.loads(config.read_text())
    destination.mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.copyfile(path, destination / path.name)


def copy_confidence(head_dir: Path, export_dir: Path) -> dict[str, Any] | None:
    """Copy a head directory's confidence files into an export; returns the config record."""
    files = confidence_files(head_dir)
    if files is None:
        return None
    _copy_checked(files, export_dir / EXPORT_FOLDER)
    names = [f"{EXPORT_FOLDER}/{path.name}" for path in files]
    return {
        "weights": names[0],
        "config": names[1],
        "sha256": {name: sha256_file(export_dir / name) for name in names},
    }


def import_confidence(export_dir: Path, head_dir: Path) -> None:
    """An export's confidence files (if any) back beside the drafter in a head directory."""
    files = confidence_files(export_dir / EXPORT_FOLDER)
    if files is not None:
        _copy_checked(files, head_dir)


def check_confidence(export_dir: Path, record: dict[str, Any] | None) -> None:
    """The copies in an export are the recorded bytes."""
    if record is None:
        if confidence_files(export_dir / EXPORT_FOLDER) is not None:
            raise ValueError(f"{export_dir}: confidence files present but not recorded in config.json")
        return
    for name, digest in record["sha256"].items():
        path = export_dir / name
        if not path.is_file() or sha256_file(path) != digest:
            raise ValueError(f"{path}: missing or not the confidence file that was exported")
