"""Turn per-request eval records into the report: JSON, a Markdown table, PNG plots, W&B.

A record is one generated turn: its task/category, prompt and response lengths, the four
decoder counters (SPEC.md §3), per-position acceptance counts, and the wall-clock time of
the same turn under each decoding method (all measured in one run, interleaved).
"""

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eval.verdict import IdentityCheck
from heads.machine import machine_line

PROMPT_BUCKETS = (0, 128, 512, 2048, math.inf)  # prompt tokens
RESPONSE_BUCKETS = (0, 32, 128, 512, math.inf)  # response tokens


@dataclass
class Record:
    task: str
    category: str
    id: str
    turn: int
    prompt_tokens: int
    response_tokens: int
    proposed_tokens: int
    accepted_draft_tokens: int
    emitted_tokens: int
    verification_rounds: int
    accepted_by_position: list[int]  # accepted draft tokens at depth 1..K
    proposed_by_position: list[int]  # proposed draft tokens at depth 1..K
    # rounds whose drafter computed >= 1..K drafts (eval/metrics.py); empty in records written
    # before it was counted, whose rounds are then priced as full rounds
    drafted_by_position: list[int] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # method -> wall-clock of this turn
    # method -> tokens it generated on this turn (sampled outputs differ in length; greedy
    # ones are identical); a method missing here counts response_tokens.
    tokens_by_method: dict[str, int] = field(default_factory=dict)

    @property
    def acceptance_length(self) -> float:
        return self.emitted_tokens / max(self.verification_rounds, 1)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarise(records: Sequence[Record], methods: Sequence[str]) -> dict:
    """AL distribution, acceptance by position and time per token of a group of records."""
    lengths = [r.acceptance_length for r in records]
    worst = sorted(lengths)[: max(1, len(lengths) // 10)]
    depth = max((len(r.proposed_by_position) for r in records), default=0)
    accepted = [
        sum(r.accepted_by_position[d] for r in records if d < len(r.accepted_by_position))
        for d in range(depth)
    ]
    proposed = [
        sum(r.proposed_by_position[d] for r in records if d < len(r.proposed_by_position))
        for d in range(depth)
    ]
    emitted = sum(r.emitted_tokens for r in records)
    rounds = sum(r.verification_rounds for r in records)
    out = {
        "requests": len(records),
        "acceptance_length": emitted / max(rounds, 1),  # token-weighted, bonus token included
        "al_mean": sum(lengths) / max(len(lengths), 1),  # mean of per-request AL
        **{f"al_p{q}": percentile(lengths, q) for q in (10, 50, 90, 99)},
        "al_worst_decile": sum(worst) / len(worst) if lengths else float("nan"),
        "draft_acceptance_rate": sum(r.accepted_draft_tokens for r in records)
        / max(sum(r.proposed_tokens for r in records), 1),
        "acceptance_by_position": [a / p if p else float("nan") for a, p in zip(accepted, proposed)],
        "tokens": sum(r.response_tokens for r in records),
    }
    for method in methods:
        # Each method's time over its own output length: at T > 0 a method that happened to stop
        # early must not look faster per token than it is.
        seconds = sum(r.seconds.get(method, 0.0) for r in records)
        tokens = sum(r.tokens_by_method.get(method, r.response_tokens) for r in records)
        out[f"ms_per_token_{method}"] = 1000 * seconds / max(tokens, 1)
    if "speculative" in methods:
        for method in methods:
            if method != "speculative" and out["ms_per_token_speculative"] > 0:
                out[f"speedup_vs_{method}"] = out[f"ms_per_token_{method}"] / out["ms_per_token_speculative"]
    return out


def bucket_name(value: int, edges: Sequence[float]) -> str:
    for low, high in zip(edges, edges[1:]):
        if low <= value < high:
            return f"{low}-{'inf' if math.isinf(high) else int(high) - 1}"
    raise ValueError(f"{value} outside the buckets {edges}")


def build_report(records: Sequence[Record], methods: Sequence[str], costs: dict | None = None) -> dict:
    """Group by task, category, prompt-length and response-length bucket.

    `costs` holds α (the cost of drafting one round, relative to one plain target step) and
    β (the extra cost of verifying K + 1 tokens over one plain step) measured by the runner.
    A full round costs 1 + α + β target steps and emits AL tokens: speculation pays where
    AL > 1 + α + β (SPEC.md §3 cost model). Where a policy drafts fewer (or no) drafts in some
    rounds, each round is priced as it ran (`round_cost`), and each group says whether
    speculation pays there against the mean cost of its own rounds (`break_even_acceptance_length`
    of the group; `priced_as_drafted` says which of the two prices it is).
    """
    groups: dict[str, dict[str, list[Record]]] = {
        "task": defaultdict(list),
        "category": defaultdict(list),
        "prompt_bucket": defaultdict(list),
        "response_bucket": defaultdict(list),
    }
    for r in records:
        groups["task"][r.task].append(r)
        groups["category"][f"{r.task}/{r.category}"].append(r)
        groups["prompt_bucket"][bucket_name(r.prompt_tokens, PROMPT_BUCKETS)].append(r)
        groups["response_bucket"][bucket_name(r.response_tokens, RESPONSE_BUCKETS)].append(r)
    report = {
        "overall": summarise(records, methods),
        **{
            kind: {name: summarise(rs, methods) for name, rs in sorted(g.items())}
            for kind, g in groups.items()
        },
        "costs": costs or {},
        "methods": list(methods),
    }
    if costs:
        for kind, grouped in groups.items():
            for name, summary in report[kind].items():
                full = costs
                if kind == "prompt_bucket" and costs.get("buckets"):  # priced at its own context length
                    full = bucket_costs(name, costs["buckets"])
                price(summary, grouped[name], costs, full["break_even_acceptance_length"])
        price(report["overall"], records, costs, costs["break_even_acceptance_length"])
    return report


def price(summary: dict, records: Sequence[Record], costs: dict, full_round: float) -> None:
    """A group's break-even (the mean cost of its rounds as drafted, else `full_round`'s) and
    whether its AL beats it, into its summary."""
    as_drafted = round_cost(records, costs)
    summary["priced_as_drafted"] = as_drafted is not None
    summary["break_even_acceptance_length"] = full_round if as_drafted is None else as_drafted
    summary["speculation_pays"] = summary["acceptance_length"] > summary["break_even_acceptance_length"]


def round_cost(records: Sequence[Record], costs: dict) -> float | None:
    """The mean cost, in target steps, of these records' rounds, each as it ran: verifying its V
    proposed drafts (verify_costs[V]) after drafting its D drafts (draft_costs[D]; a round that
    drafts nothing is a plain step, 1), at the context nearest the turn's (`context_costs`).
    Plain decoding emits one token per step, so speculation pays where AL beats it; for a policy
    that always drafts K it is 1 + α + β. None where rounds cannot be priced so: trees and Medusa
    (one cost, the full tree), costs or records from before draft counts were kept."""
    rounds = sum(r.verification_rounds for r in records)
    if not rounds or any(not r.drafted_by_position for r in records):
        return None
    total = 0.0
    for r in records:
        at = context_costs(r, costs)
        if not at.get("verify_costs") or not at.get("draft_costs"):
            return None
        total += _priced(r.proposed_by_position, r.verification_rounds, at["verify_costs"])
        total += _priced(r.drafted_by_position, r.verification_rounds, at["draft_costs"])
    return total / rounds


def context_costs(record: Record, costs: dict) -> dict:
    """The costs measured at the context nearest a turn's middle (its prompt and half its reply);
    `costs` itself where it holds one context only."""
    buckets = costs.get("buckets")
    if not buckets:
        return costs
    return nearest_context(buckets, record.prompt_tokens + record.response_tokens / 2)


def _priced(at_least: Sequence[int], rounds: int, prices: Sequence[float]) -> float:
    """Σ over rounds of prices[n], n each round's count, from at_least[i] = rounds whose count
    exceeds i (the counters' per-position counts)."""
    reaching = [rounds, *at_least, 0]  # rounds whose count is >= n
    counts = [reaching[n] - reaching[n + 1] for n in range(len(reaching) - 1)]
    if any(counts[n] for n in range(len(prices), len(counts))):
        raise ValueError(f"rounds with up to {len(counts) - 1} drafts, costs measured for {len(prices) - 1}")
    return sum(count * prices[n] for n, count in enumerate(counts) if count)


def bucket_costs(bucket: str, buckets: dict[str, dict]) -> dict:
    """The costs measured at the context nearest a prompt bucket's middle ("128-511" -> 256 of
    128/256/512/1024; an open-ended bucket counts as twice its lower edge)."""
    low, high = bucket.split("-")
    return nearest_context(buckets, (int(low) + (2 * int(low) if high == "inf" else int(high) + 1)) / 2)


def nearest_context(buckets: dict[str, dict], tokens: float) -> dict:
    """The costs measured at the context (keyed by its length) nearest `tokens`."""
    return buckets[min(buckets, key=lambda context: abs(int(context) - tokens))]


def markdown(report: dict) -> str:
    """report.md, readable on its own: what ran on what, the tables, the checks that ran."""
    sections = [
        _title(report),
        _al_table(report),
        _times(report),
        _costs(report),
        [f"Checks: greedy output {greedy_check(report)}."],
        _compare(report),
        _calibration(report),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections if lines) + "\n"


def greedy_check(report: dict) -> str:
    """The lossless check in words: greedy speculative output against the plain loop and HF."""
    return IdentityCheck(**report["identity"]).describe()


def speculation_verdict(report: dict) -> str:
    """Does speculation pay here? Overall AL against the cost of its rounds measured on this
    machine: as drafted where they are priced so, else 1 + α + β."""
    costs = report["costs"]
    if not costs:
        return "speculation not priced (Medusa heads' costs are not measured)"
    overall = report["overall"]
    al, threshold = overall["acceptance_length"], break_even(report)
    pays = al > threshold
    full = f"1 + α {costs['alpha']:.2f} drafting + β {costs['beta']:.2f} verifying, in target steps"
    if overall.get("priced_as_drafted"):
        against = (
            f"the {threshold:.2f} target steps its rounds cost as drafted, drafting and verifying "
            f"(a full round: {full} = {costs['break_even_acceptance_length']:.2f})"
        )
    else:
        against = f"a break-even of {threshold:.2f} ({full})"
    verdict = (
        f"speculation {'pays' if pays else 'does not pay'} on this machine: AL {al:.2f} against {against}"
    )
    timed = overall.get("speedup_vs_plain")
    if timed is not None and (timed < 1 if pays else timed > 1):
        # The costs are timed once, before decoding: a machine whose load changed in between (a
        # shared CPU) prices the rounds wrongly, while the timed decoding paid what it paid.
        verdict += (
            f"; but the timed decoding ran at {timed:.2f}x plain: the costs were measured before it, at a "
            f"target step of {costs['target_step_ms']:.0f} ms against the plain loop's "
            f"{overall['ms_per_token_plain']:.0f} ms per token; where the machine's load changed in "
            "between, trust the timed ratio"
        )
    return verdict


def break_even(report: dict) -> float:
    """The overall AL speculation must beat: its rounds' mean cost as drafted where they are
    priced so, else a full round's 1 + α + β."""
    overall = report["overall"]
    if overall.get("priced_as_drafted"):
        return overall["break_even_acceptance_length"]
    return report["costs"]["break_even_acceptance_length"]


def _baselines(report: dict) -> list[str]:
    return [m for m in report["methods"] if m != "speculative"]


def _title(report: dict) -> list[str]:
    head, s = report["head"], report["settings"]
    drafting = f"{s['mode']} drafting, {s['policy']} policy, up to {s['draft_length']} drafts per round"
    return [
        f"# Speculative decoding eval: {head['kind']} head",
        "",
        f"Head `{head['dir']}`; tasks {', '.join(s['tasks'])} ({s['prompts_per_task'] or 'all'} prompts "
        f"each, up to {s['max_new_tokens']} new tokens per turn); {drafting}; temperature "
        f"{s['temperature']}{_verification(s)}. AL = tokens emitted per verification round (bonus token included); "
        "× = speed-up in time per token against each baseline, timed on the same turns, interleaved.",
    ] + ([f"Timed on: {machine_line(report['machine'])}."] if report.get("machine") else [])


def _verification(settings: dict) -> str:
    """How sampled chains were judged (greedy rounds compare argmaxes either way)."""
    rule = settings.get("verification", "token")
    return "" if settings["temperature"] == 0 else f", {rule}-wise verification of sampled chains"


def _al_table(report: dict) -> list[str]:
    methods = _baselines(report)
    priced = bool(report["costs"])
    header = ["group", "n", "AL", "p10", "p50", "p90", "worst 10%"]
    header += ["break-even AL"] * priced + ["ms/tok spec"] + [f"× vs {m}" for m in methods]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    groups = [("**overall**", report["overall"])] + [
        (f"{kind}: {name}", s)
        for kind in ("task", "category", "prompt_bucket", "response_bucket")
        for name, s in report[kind].items()
    ]
    for name, s in groups:
        cells = [name, str(s["requests"])]
        cells += [
            f"{s[key]:.2f}" for key in ("acceptance_length", "al_p10", "al_p50", "al_p90", "al_worst_decile")
        ]
        cells += [f"{s['break_even_acceptance_length']:.2f}"] * priced
        cells.append(f"{s.get('ms_per_token_speculative', float('nan')):.1f}")
        cells += [f"{s.get(f'speedup_vs_{m}', float('nan')):.2f}" for m in methods]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _times(report: dict) -> list[str]:
    """Time per token of every method over all turns: what the speed-ups divide."""
    overall = report["overall"]
    lines = [
        f"Time per token over all {overall['requests']} turns ({overall['tokens']} tokens):",
        "",
        "| method | ms/token | tokens/s |",
        "|---|---|---|",
    ]
    for method in report["methods"]:
        ms = overall[f"ms_per_token_{method}"]
        lines.append(f"| {method} | {ms:.1f} | {1000 / ms if ms else float('nan'):.1f} |")
    return lines


def _costs(report: dict) -> list[str]:
    costs = report["costs"]
    if not costs:
        return []
    lines = [
        f"Measured costs: α = {costs['alpha']:.3f} (drafting a round / target step), "
        f"β = {costs['beta']:.3f} (verification overhead / target step); a full round of "
        f"{costs['verify_tokens'] - 1} drafts costs 1 + α + β = {costs['break_even_acceptance_length']:.2f} "
        f"target steps. Overall: {speculation_verdict(report)}."
    ]
    if costs.get("verify_costs"):
        curve = ", ".join(f"{cost:.2f}" for cost in costs["verify_costs"])
        lines.append(f"Verifying 0, 1, 2, ... drafts costs {curve} target steps.")
    if costs.get("draft_costs") and len(costs["draft_costs"]) > 1:
        curve = ", ".join(f"{cost:.2f}" for cost in costs["draft_costs"][1:])
        lines.append(
            f"Drafting 1, 2, ... drafts costs {curve} target steps: the table's break-even AL of each "
            "group is the mean cost of its own rounds, priced as they were drafted and verified."
        )
    if costs.get("buckets"):
        lines += [
            "",
            "| context tokens | target step (ms) | α | β | full round (1 + α + β) |",
            "|---|---|---|---|---|",
        ]
        for context, bucket in costs["buckets"].items():
            lines.append(
                f"| {context} | {bucket['target_step_ms']:.1f} | {bucket['alpha']:.3f} | {bucket['beta']:.3f} "
                f"| {bucket['break_even_acceptance_length']:.2f} |"
            )
    return lines


def _compare(report: dict) -> list[str]:
    methods = _baselines(report)
    compared = report["compare"]
    if not compared:
        return []
    main = report["settings"]["policy"] + ":" + str(report["settings"]["draft_length"])
    lines = ["Drafting settings on the same turns (interleaved):", ""]
    lines += ["| setting | task | AL | ms/tok spec | " + " | ".join(f"× vs {m}" for m in methods) + " |"]
    lines.append("|" + "---|" * (4 + len(methods)))
    for setting, summary in {main: report, **compared}.items():
        for task, t in {**summary["task"], "overall": summary["overall"]}.items():
            cells = [
                setting,
                task,
                f"{t['acceptance_length']:.2f}",
                f"{t.get('ms_per_token_speculative', float('nan')):.1f}",
            ]
            cells += [f"{t.get(f'speedup_vs_{m}', float('nan')):.2f}" for m in methods]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _calibration(report: dict) -> list[str]:
    calibration = report["calibration"]
    if not calibration:
        return []
    lines = [
        f"Confidence calibration on real decoding ({calibration['rounds']} rounds; survival a_j = Π c_i "
        "against the realised accept-prefix), before → after temperature scaling:",
        "",
        "| position | rounds | accept rate | ECE | ECE if calibrated | AUROC | Brier |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in calibration["positions"]:
        b, a = p["before"], p["after"]
        lines.append(
            f"| {p['position']} | {p['rounds']} | {p['accept_rate']:.2f} | {_num(b['ece'])} → {_num(a['ece'])} "
            f"| {_num(a.get('ece_if_calibrated'))} "
            f"| {_num(b['auroc'])} → {_num(a['auroc'])} | {_num(b['brier'])} → {_num(a['brier'])} |"
        )
    lines.append(
        "(ECE if calibrated: what a perfectly calibrated head would score on these rounds, after "
        "calibration; an ECE near it is as good as this many rounds can show.)"
    )
    return lines


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


MARKERS = ("o", "s", "^", "D", "v", "P", "X")  # one per series, so overlapping ones stay visible


def plot(report: dict, records: Sequence[Record], out_dir: Path) -> list[Path]:
    """AL distribution per task, acceptance by position, speed-up per bucket."""
    import matplotlib

    matplotlib.use("Agg")
    paths = [_al_distribution(records, out_dir / "al_distribution.png")]
    paths.append(_acceptance_by_position(report, out_dir / "acceptance_by_position.png"))
    if _baselines(report):
        paths.append(_speedup_by_bucket(report, out_dir / "speedup_by_bucket.png"))
    return paths


def _al_distribution(records: Sequence[Record], path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    by_task = defaultdict(list)
    for r in records:
        by_task[r.task].append(r.acceptance_length)
    ax.hist(list(by_task.values()), label=list(by_task), bins=20, histtype="step", linewidth=1.5)
    ax.set(xlabel="acceptance length per request", ylabel="requests", title="AL distribution per task")
    ax.yaxis.get_major_locator().set_params(integer=True)  # counts of requests
    _legend_outside(ax)
    return _save(fig, path)


def _acceptance_by_position(report: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    depth = 1
    for i, (task, s) in enumerate(report["task"].items()):
        rates = s["acceptance_by_position"]
        depth = max(depth, len(rates))
        marker = MARKERS[i % len(MARKERS)]
        ax.plot(range(1, len(rates) + 1), rates, marker=marker, markersize=8, fillstyle="none", label=task)
    ax.set_xticks(range(1, depth + 1))  # draft positions are whole numbers
    ax.set(xlabel="draft position", ylabel="acceptance rate", title="Acceptance by position", ylim=(0, 1.02))
    _legend_outside(ax)
    return _save(fig, path)


def _speedup_by_bucket(report: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    baselines = _baselines(report)
    fig, ax = plt.subplots(figsize=(8, 4))
    names = [f"prompt {k}" for k in report["prompt_bucket"]] + [
        f"resp {k}" for k in report["response_bucket"]
    ]
    summaries = list(report["prompt_bucket"].values()) + list(report["response_bucket"].values())
    width = 0.8 / len(baselines)
    for i, method in enumerate(baselines):
        ax.bar(
            [x + i * width for x in range(len(names))],
            [s.get(f"speedup_vs_{method}", 0.0) for s in summaries],
            width,
            label=f"vs {method}",
        )
    ax.axhline(1.0, color="black", linewidth=0.8, label="break-even (1x)")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], names, rotation=30, ha="right")
    ax.set(ylabel="speed-up", title="Speed-up per bucket")
    _legend_outside(ax)
    return _save(fig, path)


def _legend_outside(ax) -> None:
    """Right of the axes, so it never hides a series or the 1.0 line."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize=10)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")  # keeps the legend outside the axes in the image
    plt.close(fig)
    return path


def write_report(report: dict, records: Sequence[Record], out_dir: Path) -> Path:
    """report.json, report.md, records.jsonl and the PNGs; returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.md").write_text(markdown(report))
    with open(out_dir / "records.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(asdict(r)) + "\n")
    report = {**report, "plots": [str(p) for p in plot(report, records, out_dir)]}
    path = out_dir / "report.json"
    path.write_text(json.dumps(report, indent=2))
    return path
