"""Reuse of a finished stage on a rerun of the job.

A stage that finishes records, in its output directory, the inputs its outputs came from
(`stage.json`); a rerun whose inputs are equal reuses the outputs and says so, and one whose
inputs differ names what changed and reruns. Inputs are contents, never file times: the digest
of a head directory's files (`heads.registry.head_digest`, the name an eval's verdict gives the
head), the resolved settings, the target's identity and weight fingerprint, the eval prompts.
The code itself is not an input: after changing it, rerun with `reuse=false`.
"""

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

STAMP = "stage.json"


def changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted names of the leaves that differ between two nested dicts."""
    changed = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changed += changed_keys(a, b, f"{prefix}{key}.")
        elif a != b:
            changed.append(f"{prefix}{key}")
    return changed


def reusable(stage: str, out_dir: Path, inputs: dict) -> list[str] | None:
    """The output paths `stage` recorded in out_dir when they came from these inputs and all
    still exist, else None (after one line saying why it reruns, when it had finished before)."""
    stamp = Path(out_dir) / STAMP
    if not stamp.is_file():
        return None
    recorded = json.loads(stamp.read_text())
    # A JSON round trip, so tuples and lists (or int and float keys) compare as they were stored.
    changed = changed_keys(recorded["inputs"], json.loads(json.dumps(inputs)))
    missing = [path for path in recorded["paths"] if not Path(path).exists()]
    if changed or missing:
        why = f"changed: {', '.join(changed)}" if changed else f"missing: {', '.join(missing)}"
        print(f"{stage}: rerun ({why})", flush=True)
        return None
    return recorded["paths"]


def record(out_dir: Path, inputs: dict, paths: list[str]) -> None:
    """Mark the stage finished with its output paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"inputs": inputs, "paths": paths}
    (Path(out_dir) / STAMP).write_text(json.dumps(payload, indent=2) + "\n")


def forget(out_dir: Path) -> None:
    """Before a stage reruns: a run killed halfway must not look finished."""
    (Path(out_dir) / STAMP).unlink(missing_ok=True)
