"""Decoding benchmark: per task, AL, tokens/s and speed-up of a trained head over the plain
loop, HF greedy and HF prompt lookup, at T=0 and T=1, for one or more drafting settings.
Every figure of one table comes from one run (same prompts, warm-up, interleaved order).

    python eval/bench.py --head outputs/eagle3/head --out outputs/bench
    python eval/bench.py --head outputs/eagle3/head --out outputs/bench \
        --settings expected_gain:8 confidence:8 static:2 static:4 static:6 static:8 draft_prob:8 \
        --calibration-prompts 4 8
    python eval/bench.py --head heads/release/smollm2-135m-eagle3 --out outputs/bench --no-calibration \
        --settings expected_gain:8 static:4 ngram:8 hybrid_static:4 hybrid_expected_gain:8
"""

import argparse
import dataclasses
import json
from pathlib import Path

from eval.run import EvalConfig, evaluate, parse_setting
from heads.machine import machine_line
from heads.target import TARGET_LINEARS, Target, TargetConfig

METHODS = ("plain", "hf_greedy", "hf_prompt_lookup")


def table(rows: list[dict]) -> str:
    """One row per temperature, setting and task. "break-even" is the mean cost of the setting's
    rounds as drafted, in target steps (eval/report.py round_cost), and "model x plain" = AL over
    it: the speed-up the measured costs predict, beside the timed one ("x vs plain")."""
    header = ["T", "setting", "task", "AL", "break-even", "model x plain", "spec tok/s"]
    header += [f"x vs {m}" for m in METHODS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [f"{row['temperature']:g}", row["setting"], row["task"], f"{row['acceptance_length']:.2f}"]
        break_even = row.get("break_even_acceptance_length")
        cells += (
            ["-", "-"]
            if break_even is None
            else [f"{break_even:.2f}", f"{row['acceptance_length'] / break_even:.2f}"]
        )
        cells.append(f"{row['tokens_per_s']:.1f}")
        cells += [f"{row.get(f'speedup_vs_{m}', float('nan')):.2f}" for m in METHODS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_bench(
    target: Target, head: Path, out: Path, base: EvalConfig, settings: list[str], temperatures
) -> list[dict]:
    """One eval per temperature: every setting and baseline decodes the same turns, interleaved."""
    rows = []
    for temperature in temperatures:
        policy, length = parse_setting(settings[0])
        cfg = dataclasses.replace(
            base, temperature=temperature, policy=policy, draft_length=length, compare=settings[1:]
        )
        report = json.loads(evaluate(target, head, cfg, out / f"T{temperature:g}").read_text())
        for setting, summary in {settings[0]: report, **report["compare"]}.items():
            for task, figures in {**summary["task"], "overall": summary["overall"]}.items():
                row = {"temperature": temperature, "setting": setting, "task": task}
                row["acceptance_length"] = figures["acceptance_length"]
                row["break_even_acceptance_length"] = figures.get("break_even_acceptance_length")
                row["tokens_per_s"] = 1000 / figures["ms_per_token_speculative"]
                row |= {k: v for k, v in figures.items() if k.startswith("speedup_vs_")}
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--head", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--target", default=TargetConfig.name)
    parser.add_argument(
        "--dtype",
        default=TargetConfig.dtype,
        choices=["float32", "bfloat16", "auto"],
        help="the target's weights (target.dtype; auto = bf16 on a CPU with AMX, where a "
        "verification costs about one decode step, else fp32)",
    )
    parser.add_argument("--tasks", nargs="+", default=["mt_bench", "humaneval", "gsm8k"])
    parser.add_argument("--prompts-per-task", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--mode", default="chain", choices=["chain", "tree"])
    parser.add_argument("--settings", nargs="+", default=["static:4"], help="policy:K, e.g. static:4")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument(
        "--calibration-prompts",
        nargs=2,
        type=int,
        default=[2, 0],
        metavar=("FIT", "REPORT"),
        help="confidence heads: held-out prompts per task to fit the temperatures on, and to report "
        "the calibration on (0: the benchmarked prompts)",
    )
    parser.add_argument(
        "--calibration",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="confidence heads: measure calibration on real decoding (--no-calibration keeps the trained "
        "temperatures and saves that decoding)",
    )
    parser.add_argument(
        "--cuda-graphs", action=argparse.BooleanOptionalAction, default=True, help="CUDA targets only"
    )
    parser.add_argument(
        "--target-linears",
        default="auto",
        choices=TARGET_LINEARS,
        help="the target's Linear path (eval.target_linears)",
    )
    parser.add_argument(
        "--verification",
        default="token",
        choices=["token", "block"],
        help="sampled chains: token-wise or block verification (eval.verification)",
    )
    parser.add_argument(
        "--adapt-rate", type=float, default=0.05, help="confidence / expected_gain (eval.adapt_rate)"
    )
    args = parser.parse_args(argv)
    target = Target.load(TargetConfig(name=args.target, dtype=args.dtype, device="auto"))
    base = EvalConfig(
        tasks=args.tasks,
        prompts_per_task=args.prompts_per_task,
        max_new_tokens=args.max_new_tokens,
        mode=args.mode,
        calibration=args.calibration,
        calibration_prompts_per_task=args.calibration_prompts[0],
        calibration_report_prompts_per_task=args.calibration_prompts[1],
        cuda_graphs=args.cuda_graphs,
        target_linears=args.target_linears,
        adapt_rate=args.adapt_rate,
        verification=args.verification,
    )
    for setting in args.settings:
        parse_setting(setting)  # a typo fails here, not after the first temperature's run
    rows = run_bench(target, args.head, args.out, base, args.settings, args.temperatures)
    (args.out / "bench.json").write_text(json.dumps(rows, indent=2))
    print(machine_line())
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
