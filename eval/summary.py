"""The closing summary: what a run measured and where its files are, in a dozen lines.

Printed last by the job (train/run.py) and by `python eval/run.py`, after every library's own
output (W&B's run summary included), so the terminal ends with the answer: AL and speed-up per
task, whether speculation pays on this machine, whether greedy output matched plain decoding,
what the export gate decided, the paths, and the command to run next.
"""

from collections.abc import Sequence
from pathlib import Path

from eval.report import break_even, greedy_check, speculation_verdict
from heads.machine import NATIVE_BF16_FLAGS

# The longer run on the target's own replies: ~80 minutes on a 2-core CPU (BENCHMARKS.md).
LONGER_RECIPE = "accelerate launch train/run.py train=cpu_recipe run_dir=outputs/cpu_recipe"
# Settings to decode beside a head of each kind that speculation does not pay for (eval.compare
# takes chain settings: EAGLE heads mix prompt lookup into their chains, a block drafter cannot).
CHEAPER_SETTINGS = {
    "eagle3": "eval.compare=[ngram:4,hybrid_expected_gain:8]",
    "eagle1": "eval.compare=[ngram:4,hybrid_expected_gain:8]",
    "dflash": "eval.compare=[ngram:4]",
}


def speedup_table(report: dict) -> list[str]:
    """AL, tokens/s and the speed-up against each baseline: a row per task, then overall."""
    baselines = [m for m in report["methods"] if m != "speculative"]
    rows = {**report["task"], "overall": report["overall"]}
    width = max(len(name) for name in ("task", *rows))
    heads = [f"x vs {m}" for m in baselines]
    lines = [f"{'task':<{width}}  {'AL':>5}  {'tok/s':>7}" + "".join(f"  {h}" for h in heads)]
    for name, summary in rows.items():
        ms = summary["ms_per_token_speculative"]
        line = f"{name:<{width}}  {summary['acceptance_length']:>5.2f}  {1000 / ms if ms else 0.0:>7.1f}"
        line += "".join(f"  {summary[f'speedup_vs_{m}']:>{len(h)}.2f}" for m, h in zip(baselines, heads))
        lines.append(line)
    return lines


def next_command(
    report: dict, exports: Sequence[Path] | None, export_command: str, refused: bool = False
) -> str:
    """What to do next: train further where speculation does not pay or the export gate refused
    the head (saying how to export it anyway), else serve or export."""
    costs, kind = report["costs"], report["head"]["kind"]
    slow = bool(costs) and report["overall"]["acceptance_length"] <= break_even(report)
    if slow or refused:
        recipe = LONGER_RECIPE if kind == "eagle3" else LONGER_RECIPE.replace("train=", f"head={kind} train=")
        advice = f"a longer run on more of the target's own replies (~80 min on a 2-core CPU): {recipe}"
        fp32 = report.get("target_dtype", "float32") == "float32"
        if slow and kind in CHEAPER_SETTINGS:
            advice += (
                f"; on a CPU, also try prompt lookup, alone or beside the head: {CHEAPER_SETTINGS[kind]}"
            )
            if fp32:  # refused for a bf16 target (eval.run.evaluate)
                advice += ", and eval.target_linears=compiled (target steps ~1.7x cheaper after minutes of compilation)"
        if slow and fp32 and NATIVE_BF16_FLAGS & set(report["machine"]["simd"]):
            advice += (
                "; this CPU computes bf16 natively: with target.dtype=bfloat16 verifying 8 drafts costs "
                "~1.05-1.4 target steps (~1.6-2.1 in fp32; BENCHMARKS.md, sessions 27-28), greedy output "
                "then checked against the bf16 plain loop"
            )
        if refused:
            advice += (
                "; to export this head anyway (recorded as forced): the same command with export.force=true"
            )
        return advice
    if exports:
        return f"serve it: {Path(exports[0]) / 'README.md'} holds the engine's command"
    return f"export it: {export_command}"


def closing_summary(
    report: dict,
    report_path: Path,
    next_step: str,
    exports: Sequence[Path] | None = None,
    gate: str | None = None,
) -> str:
    """The summary text. exports: the validated export directories (None: no export stage ran);
    gate: the export gate's decision in words."""
    head = report["head"]
    plots = list(report["plots"]) + list((report["calibration"] or {}).get("images") or [])
    lines = ["", "=" * 80, f"Summary: {head['kind']} head, eval of {report['overall']['requests']} turns", ""]
    lines += speedup_table(report)
    lines += ["", speculation_verdict(report), f"greedy output {greedy_check(report)}"]
    if gate is not None:
        lines.append(gate)
    lines += ["", f"report   {Path(report_path).with_name('report.md')} (figures: {report_path})"]
    lines.append(f"plots    {', '.join(str(p) for p in plots) or 'none'}")
    lines.append(f"head     {head['dir']}")
    if head["calibrated_dir"]:
        lines.append(f"         {head['calibrated_dir']} (confidence temperatures fitted on real decoding)")
    if exports is not None:
        lines.append(f"exports  {', '.join(str(p) for p in exports) or 'none'}")
    lines += [f"next     {next_step}", "=" * 80]
    return "\n".join(lines)
