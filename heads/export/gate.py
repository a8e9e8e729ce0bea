"""The export gate: an export ships only a head whose eval verdict (eval/verdict.py) vouches for it.

Two conditions are about trust and no setting lifts them: the verdict names this head (its
digest equals the digest of the head directory being exported) and greedy identity held on
every checked turn (against the plain loop and HF `generate`). A verdict that fails either
would make the card quote figures that are not about this head, or a decoder that is not
lossless. The third is about worth: every task's acceptance length must beat the break-even
the eval measured on its machine (the mean cost of that task's rounds as drafted, or of a full
round, 1 + alpha + beta, where rounds are not priced as drafted: speculation pays there), or
reach an absolute floor when `export.min_acceptance_length` sets one. Only this one (and a missing
verdict) can be forced, and a forced export says so in its card and in gate.json.
"""

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eval.verdict import Verdict, read_verdict
from heads.registry import head_digest

log = logging.getLogger(__name__)

GATE_FILE = "gate.json"  # in every export: the decision and the verdict it read


class GateRefused(ValueError):
    """The gate refused an export; the message says why and which setting would force it."""


@dataclass(frozen=True)
class GateDecision:
    verdict: Verdict | None  # None: no verdict was given or found (only a forced export gets here)
    # the AL every task had to clear (per task where rounds are priced as drafted); None when
    # none could be set
    threshold: float | dict[str, float] | None
    rule: str  # the threshold in words, with the setting that chose it
    refusals: tuple[str, ...]  # why the gate refused, one reason each; empty: it passed
    forced: bool  # exported although it refused

    @property
    def passed(self) -> bool:
        return not self.refusals

    def describe(self) -> str:
        return describe(self.record())

    def record(self) -> dict[str, Any]:
        """gate.json and the exported config's "drafter"."gate" (the verdict goes beside it)."""
        fields = asdict(self) | {"passed": self.passed, "refusals": list(self.refusals)}
        return {key: value for key, value in fields.items() if key != "verdict"}


def describe(record: dict[str, Any]) -> str:
    """A gate record in one line, for the log, the job's summary and the card."""
    if record["passed"]:
        return f"export gate: passed (every task's AL {record['rule']})"
    verdict = "FORCED past it" if record["forced"] else "REFUSED"
    return f"export gate: {verdict}: {'; '.join(record['refusals'])}"


def untrusted(verdict: Verdict, head_dir: Path, where: Path) -> list[str]:
    """What makes a verdict say nothing about this head: another digest, or identity failures."""
    problems = []
    digest = head_digest(head_dir)
    if verdict.head_sha256 != digest:
        problems.append(
            f"the verdict {where} is about head {verdict.head_sha256[:12]} ({verdict.head_dir}), "
            f"not {head_dir} ({digest[:12]}): export the head it evaluated, or evaluate this one"
        )
    identity = verdict.identity
    if identity.mismatches or not identity.turns:
        problems.append(f"greedy identity failed in {where}: {identity.describe()}")
    return problems


def threshold_for(
    verdict: Verdict, floor: float | None, floor_name: str
) -> tuple[float | dict[str, float] | None, str]:
    """(threshold, rule in words): the floor when set, else the measured break-even: per task
    where the verdict priced each task's rounds as drafted."""
    if floor is not None:
        return floor, f">= {floor} ({floor_name})"
    if verdict.break_even_acceptance_length is None:
        return None, f"no break-even measured for a {verdict.head_kind} head: set {floor_name}"
    full = verdict.break_even_acceptance_length
    if verdict.break_even_by_task is not None:
        return verdict.break_even_by_task, (
            "> the break-even of its rounds as drafted (their mean cost in target steps, measured by "
            f"the eval; a full round: 1 + alpha + beta = {full:.3f})"
        )
    return full, f"> the break-even {full:.3f} (1 + alpha + beta measured by the eval)"


def below(
    verdict: Verdict, threshold: float | dict[str, float] | None, floor: float | None, rule: str
) -> list[str]:
    """The reason, naming every task whose AL does not clear its threshold (a floor is reached
    at equality, the break-even must be beaten); none when every task clears it."""
    if threshold is None:
        return [rule]
    per_task = isinstance(threshold, dict)
    failing = []
    for task, al in sorted(verdict.acceptance_length.items()):
        clear = threshold[task] if per_task else threshold
        if not (al >= clear if floor is not None else al > clear):
            failing.append(f"{task} AL {al:.3f}" + (f" (its rounds cost {clear:.3f})" if per_task else ""))
    return [f"{', '.join(failing)} {'is' if len(failing) == 1 else 'are'} not {rule}"] if failing else []


def gate(
    verdict_path: Path | None,
    head_dir: Path,
    min_acceptance_length: float | None,
    force: bool,
    floor_name: str = "export.min_acceptance_length",
    force_setting: str = "export.force=true",
) -> GateDecision:
    """Decide on exporting head_dir; raises GateRefused unless it passes or is forced. The names
    are the caller's spelling of the two settings (the job's keys, or the tool's flags)."""
    if verdict_path is None or not Path(verdict_path).is_file():
        verdict, threshold, rule = None, min_acceptance_length, "no verdict"
        refusals = [f"no eval verdict ({verdict_path or 'none given'}; run the eval first)"]
    else:
        verdict = read_verdict(verdict_path)
        problems = untrusted(verdict, Path(head_dir), Path(verdict_path))
        if problems:
            raise GateRefused(f"export refused: {'; '.join(problems)} (no setting forces this)")
        threshold, rule = threshold_for(verdict, min_acceptance_length, floor_name)
        refusals = below(verdict, threshold, min_acceptance_length, rule)
    decision = GateDecision(verdict, threshold, rule, tuple(refusals), forced=bool(refusals) and force)
    if refusals and not force:
        raise GateRefused(
            f"export refused: {'; '.join(refusals)}; set {force_setting} to export anyway "
            "(recorded in the card and gate.json)"
        )
    (log.warning if decision.forced else log.info)("%s", decision.describe())
    return decision
