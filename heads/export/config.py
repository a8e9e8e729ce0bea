"""The typed `export.*` settings (a leaf module: the job's schema and `python -m heads.export`
share one default)."""

from dataclasses import dataclass


@dataclass
class ExportConfig:
    # null: every layout the head's kind has (EAGLE-3: sglang, vllm, speculators; EAGLE-1: vllm;
    # Medusa: vllm, medusa; DFlash: speculators). Or a list of them, to export fewer.
    formats: list[str] | None = None
    # The gate (heads/export/gate.py), per task, on the eval's verdict. null: every task's AL must
    # beat the break-even the eval measured on its machine (1 + alpha + beta), i.e. speculation
    # must pay there; the quick job's head on a CPU does not (AL ~1.27 against ~1.76), and is
    # refused. A number: an absolute floor every task must reach instead, e.g. for a head served
    # on a GPU, whose costs the CPU eval does not measure (EAGLE-3 reaches ~3.9 there; SPEC.md §7),
    # and needed for Medusa heads, whose costs the eval does not measure. The one default of the
    # job and of `python -m heads.export`.
    min_acceptance_length: float | None = None
    # Export even below the gate (or without a verdict); recorded in the card and gate.json. A
    # verdict about another head, or with greedy mismatches, is refused even so.
    force: bool = False
    # Name the target's local directory (not its hub name) as the speculators layout's verifier,
    # so speculators' from_pretrained works offline; the export then only works on this machine.
    local_verifier: bool = False
