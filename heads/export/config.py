"""The typed `export.*` settings (a leaf module: the job's schema and `python -m heads.export`
share one default)."""

from dataclasses import dataclass


@dataclass
class ExportConfig:
    # null: every layout the head's kind has (EAGLE-3: sglang, vllm, speculators; EAGLE-1: vllm;
    # Medusa: vllm, medusa). Or a list of them, to export fewer.
    formats: list[str] | None = None
    # Refuse to export a head whose eval AL (mean over tasks) is below this; the one default of
    # the job and of `python -m heads.export`. Low, because the minutes-long quick head reaches
    # ~1.18 on a CPU; raise it for production heads.
    min_acceptance_length: float = 1.1
    # Export even below the gate; recorded in the exported config.
    force: bool = False
    # Name the target's local directory (not its hub name) as the speculators layout's verifier,
    # so speculators' from_pretrained works offline; the export then only works on this machine.
    local_verifier: bool = False
