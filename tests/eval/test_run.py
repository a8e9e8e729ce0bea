"""The eval stage end to end on a tiny target: report, plots, costs, greedy identity, verdict."""

import dataclasses
import json
from pathlib import Path

import pytest

from eval.verdict import IdentityCheck
from tests.test_configs import compose_command
from train.run import run


@pytest.fixture
def prompts_jsonl(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [
        {"task": "toy", "id": "a", "category": "chat", "turns": ["the cat sat", "and then"]},
        {"task": "toy", "id": "b", "category": "chat", "turns": ["a dog ran under the table"]},
        {"task": "toy2", "id": "c", "category": "code", "turns": ["red blue red blue"]},
        # Held out from the eval (prompts_per_task=3): confidence calibration decodes these.
        {"task": "toy", "id": "d", "category": "chat", "turns": ["one two three four"]},
        {"task": "toy", "id": "e", "category": "chat", "turns": ["the table and the cat"]},
        {"task": "toy", "id": "f", "category": "chat", "turns": ["blue red blue"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _eval_overrides(prompts_jsonl, *extra):
    return (
        f"eval.tasks=[{prompts_jsonl}]",
        "eval.prompts_per_task=3",
        "eval.max_new_tokens=8",
        "eval.draft_length=3",
        "stages=[prepare,train,eval]",
        *extra,
    )


def test_eval_stage_writes_a_report_with_al_speedups_costs_and_plots(make_job, prompts_jsonl, tmp_path):
    results = run(
        make_job(*_eval_overrides(prompts_jsonl, "stages=[prepare,train,eval,export]", "export.force=true"))
    )
    assert [p.split("/")[-1] for p in results["exports"]] == ["sglang", "vllm", "speculators"]
    out = tmp_path / "run" / "eval"
    report = json.loads((out / "report.json").read_text())
    assert report["greedy_mismatches"] == 0
    assert set(report["task"]) == {"toy", "toy2"}
    overall = report["overall"]
    assert overall["requests"] == 4  # two turns of prompt a, one each of b and c
    assert 1.0 <= overall["acceptance_length"] <= 1 + 3
    for method in ("plain", "hf_greedy", "hf_prompt_lookup"):
        assert overall[f"speedup_vs_{method}"] > 0
    assert report["costs"]["alpha"] > 0 and report["costs"]["break_even_acceptance_length"] > 1
    curve = report["costs"]["verify_costs"]  # verifying 0..3 drafts, in plain target steps
    assert len(curve) == 4 and curve[0] == 1.0 and all(cost > 0 for cost in curve)
    assert "speculation_pays" in report["prompt_bucket"][next(iter(report["prompt_bucket"]))]
    assert len(overall["acceptance_by_position"]) == 3
    assert all(
        (out / name).is_file() for name in ("al_distribution.png", "acceptance_by_position.png", "report.md")
    )
    assert len((out / "records.jsonl").read_text().splitlines()) == 4
    assert report["greedy_checked_turns"] == 4
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# Speculative decoding eval: eagle3 head")
    assert "on 4 turns: 0 mismatches against the plain loop, 0 against HF generate" in markdown


def test_the_verdict_names_the_evaluated_head_its_drafting_al_and_identity(make_job, prompts_jsonl, tmp_path):
    from eval.verdict import read_verdict
    from heads.registry import head_digest

    run(make_job(*_eval_overrides(prompts_jsonl, "eval.policy=draft_prob")))
    out = tmp_path / "run" / "eval"
    report, verdict = json.loads((out / "report.json").read_text()), read_verdict(out / "verdict.json")
    assert verdict.head_dir == str(out / "calibrated_head")  # the head as evaluated, which export ships
    assert verdict.head_sha256 == head_digest(out / "calibrated_head")
    assert verdict.trained_head_sha256 == head_digest(tmp_path / "run" / "head")
    assert verdict.drafting == {
        "drafter": "eagle3 chain",
        "policy": "draft_prob",
        "draft_length": 3,
        "policy_threshold": 0.3,
        "temperature": 0.0,
        "verification": "greedy (argmax)",
    }
    assert verdict.acceptance_length == {t: s["acceptance_length"] for t, s in report["task"].items()}
    assert set(verdict.acceptance_length) == {"toy", "toy2"}
    assert verdict.overall_acceptance_length == report["overall"]["acceptance_length"]
    assert verdict.break_even_acceptance_length == report["costs"]["break_even_acceptance_length"]
    assert verdict.identity == IdentityCheck(turns=4, plain_mismatches=0, hf_mismatches=0, greedy_pass=False)


def _tamper(monkeypatch, plain: bool):
    """Make our plain loop (plain=True) or HF generate return one token more than it decoded."""
    import eval.run
    from eval.decoder import SpeculativeDecoder

    if plain:
        original = SpeculativeDecoder.generate_plain

        def tampered(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            return dataclasses.replace(out, tokens=out.tokens + [0])

        monkeypatch.setattr(SpeculativeDecoder, "generate_plain", tampered)
    else:
        original_hf = eval.run.hf_generate

        def tampered_hf(*args, **kwargs):
            tokens, seconds = original_hf(*args, **kwargs)
            return tokens + [0], seconds

        monkeypatch.setattr(eval.run, "hf_generate", tampered_hf)


@pytest.mark.parametrize("plain", [True, False])
def test_with_baselines_off_identity_is_still_checked_against_the_plain_loop_and_hf(
    make_job, prompts_jsonl, tmp_path, monkeypatch, plain
):
    """Before verdicts, eval.baselines=false compared the decoder with itself: no reference could fail it."""
    from eval.verdict import read_verdict

    _tamper(monkeypatch, plain)  # training never decodes: only the eval's references change
    overrides = _eval_overrides(prompts_jsonl, "eval.baselines=false", "eval.calibration=false")
    with pytest.raises(RuntimeError, match="mismatches against the plain loop"):
        run(make_job(*overrides, "train.max_steps=2"))
    identity = read_verdict(tmp_path / "run" / "eval" / "verdict.json").identity
    assert (identity.plain_mismatches, identity.hf_mismatches) == ((4, 0) if plain else (0, 4))
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    assert report["methods"] == ["speculative"] and report["greedy_mismatches"] == 4


def test_tree_mode_and_sampling_run(make_job, prompts_jsonl, tmp_path):
    from eval.verdict import read_verdict

    run(make_job(*_eval_overrides(prompts_jsonl, "eval.mode=tree", "eval.baselines=false")))
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    assert report["greedy_mismatches"] == 0 and report["methods"] == ["speculative"]
    assert report["greedy_checked_turns"] == 4  # against a real plain loop and HF, untimed
    run(make_job(*_eval_overrides(prompts_jsonl, "eval.temperature=1.0", "train.max_steps=6")))
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    assert report["overall"]["requests"] == 4
    # Sampled turns have no token-for-token reference: a greedy pass of the same setting is checked.
    verdict = read_verdict(tmp_path / "run" / "eval" / "verdict.json")
    assert verdict.identity == IdentityCheck(turns=4, plain_mismatches=0, hf_mismatches=0, greedy_pass=True)
    assert verdict.drafting["temperature"] == 1.0 and verdict.drafting["verification"] == "token-wise"


def test_eval_refuses_a_head_trained_for_another_target(make_job, tmp_path):
    from heads.target import Target

    job = make_job()
    run(job)
    head_dir = tmp_path / "run" / "head"
    identity = json.loads((head_dir / "target.json").read_text())
    identity["tokenizer_hash"] = "0" * 64
    (head_dir / "target.json").write_text(json.dumps(identity))
    with pytest.raises(ValueError, match="tokenizer_hash"):
        Target.load(job.target).check_head_dir(head_dir)


def test_a_compiled_forward_of_a_bf16_target_on_a_cpu_is_refused_before_decoding(tmp_path):
    import torch

    from eval.run import EvalConfig, evaluate
    from heads.target import Target
    from tests.helpers import tiny_llama, tiny_tokenizer

    target = Target.from_pretrained_model(tiny_llama().to(torch.bfloat16), tiny_tokenizer())
    with pytest.raises(ValueError, match="eval.target_linears=compiled with a bfloat16 target on a CPU"):
        evaluate(target, tmp_path / "head", EvalConfig(target_linears="compiled"), tmp_path / "eval")


def test_bench_ranks_settings_on_the_same_interleaved_turns(make_job, prompts_jsonl, tmp_path):
    from eval.bench import run_bench, table
    from eval.run import EvalConfig, parse_setting
    from heads.target import Target

    job = make_job()
    run(job)
    base = EvalConfig(tasks=[str(prompts_jsonl)], prompts_per_task=3, max_new_tokens=6)
    settings = ["static:2", "draft_prob:3", "confidence:3", "ngram:3"]
    rows = run_bench(
        Target.load(job.target), tmp_path / "run" / "head", tmp_path / "bench", base, settings, [0.0, 1.0]
    )
    assert len(rows) == 2 * 4 * 3  # temperatures x settings x (2 tasks + overall)
    assert all(row["tokens_per_s"] > 0 and row["speedup_vs_hf_greedy"] > 0 for row in rows)
    assert table(rows).count("\n") == len(rows) + 1
    greedy = json.loads((tmp_path / "bench" / "T0" / "report.json").read_text())
    # Every setting's rounds are priced as drafted; an n-gram round pays only its verification.
    assert all(row["break_even_acceptance_length"] >= 1 for row in rows)
    ngram = [
        r["break_even_acceptance_length"] for r in rows if r["setting"] == "ngram:3" and r["temperature"] == 0
    ]
    assert max(ngram) <= max(greedy["costs"]["verify_costs"])
    assert greedy["greedy_mismatches"] == 0  # every compared setting is checked against plain decoding
    assert set(greedy["compare"]) == {"draft_prob:3", "confidence:3", "ngram:3"}
    assert greedy["compare"]["draft_prob:3"]["overall"]["requests"] == greedy["overall"]["requests"] == 4
    assert "Drafting settings on the same turns" in (tmp_path / "bench" / "T0" / "report.md").read_text()
    with pytest.raises(ValueError, match="policy:K"):
        parse_setting("static")


def test_confidence_head_is_calibrated_on_decoding_and_drives_the_policies(make_job, prompts_jsonl, tmp_path):
    from heads.registry import head_digest

    run(make_job())
    trained = head_digest(tmp_path / "run" / "head")
    run(
        make_job(
            *_eval_overrides(
                prompts_jsonl,
                "eval.calibration_prompts_per_task=1",
                "eval.calibration_report_prompts_per_task=2",
                "eval.policy=confidence",
            )
        )
    )
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    calibration = report["calibration"]
    assert calibration["rounds"] > 0 and calibration["positions"][0]["position"] == 1
    assert {"ece", "ece_if_calibrated", "auroc", "brier"} <= set(calibration["positions"][0]["after"])
    assert calibration["fitted_on_rounds"][0] > 0
    assert all(Path(p).is_file() for p in calibration["images"])
    assert report["greedy_mismatches"] == 0
    assert "Confidence calibration" in (tmp_path / "run" / "eval" / "report.md").read_text()
    fitted = json.loads(
        (tmp_path / "run" / "eval" / "calibrated_head" / "confidence_config.json").read_text()
    )
    assert (
        fitted["args"]["temperatures"] == calibration["temperatures"]
    )  # one per position, fitted on decoding
    assert len(fitted["args"]["temperatures"]) == 3
    assert head_digest(tmp_path / "run" / "head") == trained  # the eval left the trained head as it was
    run(make_job(*_eval_overrides(prompts_jsonl, "eval.policy=expected_gain", "eval.baselines=false")))
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    assert report["greedy_mismatches"] == 0 and report["overall"]["requests"] == 4
    assert report["greedy_checked_turns"] == 4  # baselines off: still checked, on every turn


def test_the_eval_command_ends_with_the_summary_and_the_export_command(
    make_job, prompts_jsonl, tiny_target_dir, tmp_path, capsys
):
    from eval.run import export_command, run_eval

    run(make_job())
    out = tmp_path / "eval_cli"
    command = (
        f"python eval/run.py head_dir={tmp_path / 'run' / 'head'} out={out} target.name={tiny_target_dir} "
        f"target.device=cpu eval.tasks=[{prompts_jsonl}] eval.prompts_per_task=3 eval.max_new_tokens=6 "
        "eval.draft_length=2 eval.baselines=false"
    )
    run_eval(compose_command(command))
    printed = capsys.readouterr().out
    assert "Summary: eagle3 head, eval of 4 turns" in printed
    assert "next     a longer run" in printed  # a tiny random head does not pay
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["draft_length"] == 2 and report["settings"]["baselines"] is False
    command = export_command(report, str(tiny_target_dir), out / "report.json")
    assert command.startswith(
        f"python -m heads.export --head {out / 'calibrated_head'} --target {tiny_target_dir}"
    )


def test_calibration_can_be_skipped_when_only_al_is_wanted(make_job, prompts_jsonl, tmp_path):
    run(make_job(*_eval_overrides(prompts_jsonl, "eval.calibration=false", "train.max_steps=2")))
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    assert report["calibration"] is None and report["head"]["calibrated_dir"] is None
    assert report["overall"]["requests"] == 4
