"""A small eval report built from made-up records, as eval/run.py assembles it."""

from dataclasses import asdict

from eval.report import Record, build_report
from eval.verdict import IdentityCheck

METHODS = ["speculative", "plain", "hf_greedy"]


def record(task: str, emitted: int, rounds: int, spec_seconds: float) -> Record:
    return Record(
        task=task,
        category="chat",
        id=f"{task}-{emitted}",
        turn=0,
        prompt_tokens=40,
        response_tokens=emitted,
        proposed_tokens=3 * rounds,
        accepted_draft_tokens=emitted - rounds,
        emitted_tokens=emitted,
        verification_rounds=rounds,
        accepted_by_position=[emitted - rounds, 0, 0],
        proposed_by_position=[rounds, rounds, rounds],
        seconds={"speculative": spec_seconds, "plain": 1.0, "hf_greedy": 2.0},
    )


def fake_records() -> list[Record]:
    """mt_bench at AL 2 (twice as fast as plain), gsm8k at AL 1.25 (slower than plain)."""
    return [record("mt_bench", 32, 16, 0.5), record("mt_bench", 16, 8, 0.5), record("gsm8k", 20, 16, 2.0)]


def fake_report(temperature: float = 0.0, mismatches: int = 0, hf_mismatches: int = 0) -> dict:
    """The report of fake_records, with a break-even AL of 1.5; identity checked on its 3 turns."""
    records = fake_records()
    costs = {
        "target_step_ms": 40.0,
        "alpha": 0.3,
        "beta": 0.2,
        "break_even_acceptance_length": 1.5,
        "verify_tokens": 4,
        "verify_costs": [1.0, 1.1, 1.15, 1.2],
    }
    report = build_report(records, METHODS, costs)
    report["compare"] = {}
    report["calibration"] = None
    report["settings"] = {
        "tasks": ["mt_bench", "gsm8k"],
        "prompts_per_task": 2,
        "max_new_tokens": 32,
        "mode": "chain",
        "policy": "static",
        "draft_length": 3,
        "temperature": temperature,
    }
    report["head"] = {"dir": "outputs/eagle3/head", "kind": "eagle3", "calibrated_dir": None}
    report["target_dtype"] = "float32"
    report["machine"] = {
        "cpu": "a test CPU",
        "cores": 2,
        "simd": ["avx2"],
        "torch_threads": 2,
        "gpu": None,
        "torch": "2.13.0+cpu",
    }
    identity = IdentityCheck(3, mismatches, hf_mismatches, greedy_pass=temperature > 0)
    report["identity"] = asdict(identity)
    report["greedy_mismatches"], report["greedy_checked_turns"] = identity.mismatches, identity.turns
    report["plots"] = ["outputs/eagle3/eval/al_distribution.png"]
    return report
