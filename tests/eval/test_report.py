"""report.md and the plots, on a small made-up report."""

import pytest
import torch

import eval.report
from eval.calibration import empty_panel_note
from eval.report import markdown, plot
from tests.eval.fake_report import fake_records, fake_report


def test_report_md_reads_on_its_own():
    text = markdown(fake_report(mismatches=1))
    lines = text.splitlines()
    assert lines[0] == "# Speculative decoding eval: eagle3 head"
    assert "tasks mt_bench, gsm8k (2 prompts each, up to 32 new tokens per turn)" in text
    table = [line for line in lines if line.startswith("| ")]
    assert table[1].startswith("| **overall** | 3 | 1.70 |")  # first row after the header
    assert "| hf_greedy | 88.2 | 11.3 |" in text  # 6 s for 68 tokens
    assert (
        "checked token for token on 3 turns: 1 mismatches against the plain loop, 0 against HF generate"
        in text
    )
    assert "Overall: speculation pays on this machine" in text


def test_plots_have_whole_positions_distinct_markers_and_legends_outside_the_data(tmp_path, monkeypatch):
    figures = {}

    def keep(fig, path):
        figures[path.name] = fig
        return path

    monkeypatch.setattr(eval.report, "_save", keep)
    paths = plot(fake_report(), fake_records(), tmp_path)
    assert [p.name for p in paths] == [
        "al_distribution.png",
        "acceptance_by_position.png",
        "speedup_by_bucket.png",
    ]
    axes = figures["acceptance_by_position.png"].axes[0]
    assert list(axes.get_xticks()) == [1, 2, 3]
    assert len({line.get_marker() for line in axes.get_lines()}) == 2  # one per task
    for fig in figures.values():
        legend = fig.axes[0].get_legend()
        assert (
            legend.get_bbox_to_anchor().transformed(fig.axes[0].transAxes.inverted()).x0 > 1
        )  # right of the axes


def test_an_empty_reliability_panel_says_why():
    assert empty_panel_note(torch.zeros(0)) == "no round drafted\nthis position"
    assert empty_panel_note(torch.zeros(5)) == "no accepted drafts\nat this position"
    assert empty_panel_note(torch.tensor([0.0, 1.0])) is None


def test_each_method_is_timed_over_its_own_output_length():
    """At T > 0 the plain loop may stop after 10 tokens where the speculative run wrote 40: its
    ms/token divides by its own 10, not by the speculative run's 40."""
    from dataclasses import replace

    from eval.report import summarise
    from tests.eval.fake_report import record

    sampled = replace(record("chat", 40, 20, 2.0), tokens_by_method={"speculative": 40, "plain": 10})
    summary = summarise([sampled], ["speculative", "plain"])
    assert summary["ms_per_token_speculative"] == 1000 * 2.0 / 40
    assert summary["ms_per_token_plain"] == 1000 * 1.0 / 10
    assert summary["speedup_vs_plain"] == (1000 / 10) / (2000 / 40)


def test_prompt_buckets_are_priced_at_their_own_context():
    from eval.report import bucket_costs

    buckets = {str(c): {"break_even_acceptance_length": c / 100} for c in (128, 256, 512, 1024)}
    assert bucket_costs("0-127", buckets) is buckets["128"]
    assert bucket_costs("128-511", buckets) is buckets["256"]
    assert bucket_costs("512-2047", buckets) is buckets["1024"]
    assert bucket_costs("2048-inf", buckets) is buckets["1024"]


def _priced_records(drafted: list[int], proposed: list[int], rounds: int = 4) -> list:
    """One record whose `rounds` rounds drafted / proposed at least 1..3 drafts as given."""
    from dataclasses import replace

    from tests.eval.fake_report import record

    return [
        replace(record("chat", 8, rounds, 1.0), proposed_by_position=proposed, drafted_by_position=drafted)
    ]


COSTS = {
    "alpha": 0.6,
    "beta": 0.3,
    "break_even_acceptance_length": 1.9,
    "verify_tokens": 4,
    "verify_costs": [1.0, 1.1, 1.2, 1.3],
    "draft_costs": [0.0, 0.3, 0.45, 0.6],
}


def test_rounds_that_draft_all_k_are_priced_at_one_plus_alpha_plus_beta():
    from eval.report import round_cost

    assert round_cost(_priced_records([4, 4, 4], [4, 4, 4]), COSTS) == pytest.approx(1.9)


def test_rounds_are_priced_as_their_policy_drafted_and_verified_them():
    """4 rounds: one plain step (nothing drafted), one that drafted 3 and verified 1, two that
    drafted and verified 2: (1.0) + (0.6 + 1.1) + 2 (0.45 + 1.2) = 6.0 target steps, 1.5 a round."""
    from eval.report import round_cost

    assert round_cost(_priced_records([3, 3, 1], [3, 2, 0]), COSTS) == pytest.approx(6.0 / 4)


def test_a_group_pays_where_its_al_beats_the_cost_of_its_own_rounds():
    """AL 1.75 against rounds costing 1.5 as drafted pays, where a full round's 1.9 would say it
    does not; records without draft counts take the full price."""
    from dataclasses import replace

    from eval.report import build_report, speculation_verdict

    records = [replace(r, emitted_tokens=7) for r in _priced_records([3, 3, 1], [3, 2, 0])]  # AL 1.75
    report = build_report(records, ["speculative", "plain"], COSTS)
    overall = report["overall"]
    assert overall["priced_as_drafted"] and overall["break_even_acceptance_length"] == pytest.approx(1.5)
    assert overall["speculation_pays"] and report["task"]["chat"]["speculation_pays"]
    assert "speculation pays on this machine: AL 1.75 against the 1.50 target steps" in speculation_verdict(
        report
    )
    old = build_report([replace(r, drafted_by_position=[]) for r in records], ["speculative", "plain"], COSTS)
    assert not old["overall"]["priced_as_drafted"] and not old["overall"]["speculation_pays"]
    assert "does not pay on this machine: AL 1.75 against a break-even of 1.90" in speculation_verdict(old)


def test_rounds_with_more_drafts_than_the_costs_cover_are_an_error():
    from eval.report import round_cost

    with pytest.raises(ValueError, match="rounds with up to 3 drafts, costs measured for 2"):
        round_cost(_priced_records([4, 4, 4], [4, 4, 4]), COSTS | {"draft_costs": [0.0, 0.3, 0.45]})


def test_each_turns_rounds_are_priced_at_the_context_nearest_its_own():
    """A short turn at the 128-token costs, a long one at the 1,024-token costs, whatever context
    the headline costs were measured at."""
    from dataclasses import replace

    from eval.report import round_cost

    cheap = COSTS | {"verify_costs": [1.0] * 4, "draft_costs": [0.0, 0.1, 0.2, 0.3]}
    dear = COSTS | {"verify_costs": [1.0, 1.5, 2.0, 2.5], "draft_costs": [0.0, 0.3, 0.6, 0.9]}
    costs = COSTS | {"buckets": {"128": cheap, "1024": dear}}
    (short,) = _priced_records([4, 4, 4], [4, 4, 4])
    long = replace(short, prompt_tokens=900)
    assert round_cost([short], costs) == pytest.approx(1.3)
    assert round_cost([long], costs) == pytest.approx(3.4)
    assert round_cost([short, long], costs) == pytest.approx((1.3 + 3.4) / 2)
