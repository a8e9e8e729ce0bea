"""The closing summary and report.md, on a small made-up report."""

from pathlib import Path

import pytest

from eval.report import speculation_verdict
from eval.summary import closing_summary, next_command
from tests.eval.fake_report import fake_report

REPORT = Path("outputs/eagle3/eval/report.json")


def _row(text: str, name: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.split()[:1] == [name])


def test_summary_gives_al_speedups_verdict_identity_gate_paths_and_next_step():
    report = fake_report()
    exports = [Path("outputs/eagle3/export/sglang"), Path("outputs/eagle3/export/vllm")]
    gate = "export gate: passed (every task's AL > the break-even 1.500)"
    text = closing_summary(report, REPORT, next_command(report, exports, "unused"), exports, gate)
    # mt_bench: 48 tokens in 24 rounds, 1 s against plain's 2 s and HF's 4 s.
    assert _row(text, "mt_bench") == ["mt_bench", "2.00", "48.0", "2.00", "4.00"]
    assert _row(text, "gsm8k") == ["gsm8k", "1.25", "10.0", "0.50", "1.00"]
    assert _row(text, "overall")[1] == f"{68 / 40:.2f}"
    assert "speculation pays on this machine: AL 1.70 against a break-even of 1.50" in text
    assert "3 turns: 0 mismatches against the plain loop, 0 against HF generate" in text
    assert gate in text
    assert "outputs/eagle3/eval/report.md" in text and "al_distribution.png" in text
    assert "outputs/eagle3/head" in text and "outputs/eagle3/export/vllm" in text
    assert "next     serve it: outputs/eagle3/export/sglang/README.md" in text


def test_summary_of_a_slow_head_says_so_and_points_to_a_longer_run():
    report = fake_report()
    report["costs"]["break_even_acceptance_length"] = 2.5
    text = closing_summary(report, REPORT, next_command(report, None, "python -m heads.export ..."))
    assert "speculation does not pay on this machine: AL 1.70 against a break-even of 2.50" in text
    assert "next     a longer run" in text and "train=cpu_recipe" in text and "ngram:4" in text
    assert "exports" not in text and "export gate" not in text
    assert "export.force" not in text


def test_the_verdict_says_when_the_timed_decoding_contradicts_the_measured_costs():
    """Costs timed on a busy machine once said 'pays' beside a decoding at 0.93x plain (session 26)."""
    report = fake_report()  # AL 1.70 against 1.5, timed at 1.00x plain: no contradiction
    assert "timed decoding" not in speculation_verdict(report)
    report["overall"]["speedup_vs_plain"] = 0.93
    report["costs"]["target_step_ms"] = 237.0
    verdict = speculation_verdict(report)
    assert verdict.startswith("speculation pays on this machine")
    assert "but the timed decoding ran at 0.93x plain" in verdict and "target step of 237 ms" in verdict
    report["costs"]["break_even_acceptance_length"] = 2.5  # does not pay, and 0.93x agrees
    assert "timed decoding" not in speculation_verdict(report)
    report["overall"]["speedup_vs_plain"] = 1.2
    assert "but the timed decoding ran at 1.20x plain" in speculation_verdict(report)


def test_the_advice_to_a_slow_head_fits_its_kind():
    """Only EAGLE heads mix prompt lookup into their chains; Medusa takes no compare setting; the
    longer recipe trains the same kind."""
    report = fake_report()
    report["costs"]["break_even_acceptance_length"] = 2.5
    report["head"]["kind"] = "dflash"
    step = next_command(report, None, "unused")
    assert (
        "head=dflash train=cpu_recipe" in step and "eval.compare=[ngram:4]" in step and "hybrid" not in step
    )
    assert "eval.target_linears=compiled" in step
    report["head"]["kind"] = "medusa"
    step = next_command(report, None, "unused")
    assert "head=medusa train=cpu_recipe" in step and "compare" not in step


@pytest.mark.parametrize("native", ["avx512_bf16", "amx_bf16"])
def test_a_slow_fp32_head_on_a_native_bf16_cpu_is_told_about_bf16(native):
    report = fake_report()
    report["costs"]["break_even_acceptance_length"] = 2.5
    report["machine"]["simd"] = ["avx2", "avx512f"]
    assert "target.dtype=bfloat16" not in next_command(report, None, "unused")
    report["machine"]["simd"].append(native)
    assert "computes bf16 natively: with target.dtype=bfloat16" in next_command(report, None, "unused")
    report["target_dtype"] = "bfloat16"  # already; and compiled linears are refused in bf16
    step = next_command(report, None, "unused")
    assert "target.dtype=bfloat16" not in step and "compiled" not in step and "ngram:4" in step


def test_when_the_gate_refuses_the_next_step_is_a_longer_run_or_a_forced_export():
    report = fake_report()  # pays overall (1.70 > 1.5), but gsm8k (1.25) does not
    step = next_command(report, [], "unused", refused=True)
    assert step.startswith("a longer run") and "train=cpu_recipe" in step
    assert step.endswith("the same command with export.force=true") and "ngram" not in step
    text = closing_summary(report, REPORT, step, [], "export refused: gsm8k AL 1.250 is not > the break-even")
    assert "exports  none" in text and "export refused: gsm8k AL 1.250" in text


def test_summary_says_how_greedy_identity_was_checked():
    sampled = closing_summary(fake_report(1.0, 0, 1), REPORT, "x")
    assert "1 against HF generate (a greedy pass of the same drafting setting" in sampled
    greedy = closing_summary(fake_report(0.0), REPORT, "x")
    assert "0 against HF generate\n" in greedy
