"""The eval's verdict on one head: what the export gate and the model card trust.

A leaf module (it imports nothing of ours), so heads/export reads verdicts without the runner.
The eval writes `<eval out>/verdict.json` beside report.json; nothing rewrites it afterwards,
and it names the head it judged by the digest of the head directory's files
(`heads.registry.head_digest`), so a verdict cannot vouch for another head.

Identity is checked greedily, token for token, on every evaluated turn: the speculative
decoder's output against our plain greedy loop and against HF greedy `generate`. The plain loop
runs the very forward the decoder verifies with, so it is the reference everywhere; HF `generate`
is one too where the target computes in fp32. In bf16 or fp16 two correct implementations round
differently and a greedy string follows the first rounding that flips an argmax (HF's own
attention backends disagree with each other there; BENCHMARKS.md, session 27), so HF's count is
reported but does not fail the check. At
eval.temperature > 0 a sampled output has no token-for-token reference (same distribution, not
the same string: SPEC.md §2), so every turn is decoded once more greedily with the same drafting
setting for the check (`IdentityCheck.greedy_pass`); the sampled path's distribution is tested
statistically by tests/, not here.
"""

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

VERDICT_FILE = "verdict.json"  # in the eval's out dir, beside report.json
FORMAT_VERSION = 1


@dataclass(frozen=True)
class IdentityCheck:
    """Greedy speculative output against two references, counted per decoded turn."""

    turns: int  # evaluated turns, each checked
    plain_mismatches: int  # outputs that differ from our plain greedy loop
    hf_mismatches: int  # outputs that differ from HF greedy `generate`
    greedy_pass: bool  # the eval sampled: a separate greedy pass of the same setting was checked
    hf_is_reference: bool = True  # False where the target computes in bf16 / fp16 (module docstring)

    @property
    def mismatches(self) -> int:
        """Mismatches against the references: what fails the check."""
        return self.plain_mismatches + (self.hf_mismatches if self.hf_is_reference else 0)

    def describe(self) -> str:
        """Follows "greedy output" in the summary, the report and the card."""
        how = " (a greedy pass of the same drafting setting: sampled outputs have no reference)"
        hf = "" if self.hf_is_reference else " (not a reference: the target computes in reduced precision)"
        return (
            f"checked token for token on {self.turns} turns: {self.plain_mismatches} mismatches against "
            f"the plain loop, {self.hf_mismatches} against HF generate{hf}{how if self.greedy_pass else ''}"
        )


@dataclass(frozen=True)
class Verdict:
    head_dir: str  # the head as evaluated (the calibrated copy when the eval fitted temperatures)
    head_sha256: str  # head_digest(head_dir): an export must ship a head with this digest
    trained_head_sha256: str  # head_digest of the trained head (equal unless calibrated)
    head_kind: str
    drafting: dict[str, Any]  # the resolved drafting setting of the main decoder
    acceptance_length: dict[str, float]  # per task, bonus token included
    overall_acceptance_length: float
    # 1 + alpha + beta measured on the eval's machine: a full round's cost in target steps; None
    # where costs are not measured (Medusa).
    break_even_acceptance_length: float | None
    identity: IdentityCheck
    format_version: int = field(default=FORMAT_VERSION)
    # Per task, the mean cost of its rounds as drafted (eval/report.py round_cost: a policy that
    # drafts fewer in some rounds pays less for them); what the gate holds each task's AL against.
    # None where rounds are priced as full rounds only (trees, verdicts written before).
    break_even_by_task: dict[str, float] | None = None


def write_verdict(verdict: Verdict, out_dir: Path) -> Path:
    """<out_dir>/verdict.json, written to a temporary name first so a killed eval leaves none."""
    path = Path(out_dir) / VERDICT_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(verdict), indent=2) + "\n")
    tmp.replace(path)
    return path


def read_verdict(path: Path) -> Verdict:
    """A verdict file, checked: an unknown version, a missing or unknown key is an error naming it."""
    data = json.loads(Path(path).read_text())
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version={data.get('format_version')!r}, expected {FORMAT_VERSION}")
    _check_keys(Verdict, data, path)
    _check_keys(IdentityCheck, data["identity"], f"{path} identity")
    return Verdict(**(data | {"identity": IdentityCheck(**data["identity"])}))


def _check_keys(cls: type, data: dict, where: object) -> None:
    names = {f.name for f in fields(cls)}
    # A field with a default may be missing: it came after the file was written (hf_is_reference).
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    if set(data) - names or required - set(data):
        raise ValueError(
            f"{where}: unknown keys {sorted(set(data) - names)}, missing keys {sorted(required - set(data))}"
        )
