"""The export stage: the eval gate, export_job's directories, the confidence files, the CLI."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eval.verdict import IdentityCheck, read_verdict, write_verdict
from heads.draft_vocab import DraftVocab
from heads.eagle3 import Eagle3Head, Eagle3Variant
from heads.export import export_head, export_job, layout_for
from heads.export.__main__ import main
from heads.export.confidence import CONFIDENCE_CONFIG, CONFIDENCE_WEIGHTS, EXPORT_FOLDER
from heads.export.gate import GATE_FILE, GateRefused
from heads.export.importer import import_to_head_dir
from heads.export.layouts import CannotExpress, TargetWeights, same_bytes
from heads.export.validate import validate_export
from heads.registry import head_digest, load_head, trained_state
from heads.target import Target, TargetConfig
from tests.heads.export.export_fixtures import make_head, meta, target_weights, verdict
from tests.helpers import tiny_llama, tiny_tokenizer
from train.config import EvalConfig, ExportConfig, JobConfig


@pytest.fixture
def target():
    return Target.from_pretrained_model(
        tiny_llama(num_layers=4, vocab_size=128, hidden_size=32), tiny_tokenizer(128)
    )


def _job(run_dir, **export):
    return JobConfig(
        target=TargetConfig(name="tiny-llama"),
        export=ExportConfig(**export),
        eval=EvalConfig(draft_length=3),
        run_dir=str(run_dir),
    )


def _write_verdict(run_dir, overall, head_dir=None, **overrides) -> Path:
    """run_dir/eval/verdict.json on head_dir (default run_dir/head): mt_bench at overall - 0.1,
    gsm8k at overall + 0.1, against a break-even of 1.5, identity held."""
    head_dir = head_dir or run_dir / "head"
    tasks = {"mt_bench": round(overall - 0.1, 6), "gsm8k": round(overall + 0.1, 6)}
    settings = dict(acceptance_length=tasks, overall_acceptance_length=overall, head_dir=str(head_dir))
    (run_dir / "eval").mkdir(parents=True, exist_ok=True)
    return write_verdict(verdict(head_digest(head_dir), **(settings | overrides)), run_dir / "eval")


def _head_dir(run_dir, target, kind="eagle3"):
    head = make_head(kind, TargetWeights.from_target(target), medusa_layers=1)
    head.save_pretrained(run_dir / "head")
    return run_dir / "head", head


def test_export_job_writes_each_format_validated(tmp_path, target):
    head_dir, head = _head_dir(tmp_path, target)
    _write_verdict(tmp_path, overall=2.0)
    paths = export_job(_job(tmp_path), target, head_dir)
    assert paths == [tmp_path / "export" / name for name in ("sglang", "vllm", "speculators")]
    weights = TargetWeights.from_target(target)
    for path in paths:
        validate_export(path, layout_for("eagle3", path.name), head, weights)
        drafter = json.loads((path / "config.json").read_text())["drafter"]
        assert drafter["verdict"]["acceptance_length"] == {"mt_bench": 1.9, "gsm8k": 2.1}
        assert drafter["verdict"]["head_sha256"] == head_digest(head_dir)
        assert drafter["draft_length"] == 4  # the verdict's drafting, not the job's eval.draft_length
        assert drafter["target"]["tokenizer_sha256"] == target.tokenizer_hash
        assert drafter["gate"]["passed"] is True and drafter["gate"]["forced"] is False
        assert json.loads((path / GATE_FILE).read_text())["gate"] == drafter["gate"]
    assert not list((tmp_path / "export").glob("*.tmp"))


@pytest.mark.parametrize("kind, formats", [("eagle1", ["vllm"]), ("medusa", ["vllm", "medusa"])])
def test_by_default_each_head_kind_exports_to_its_own_engines_layouts(tmp_path, target, kind, formats):
    head_dir, _ = _head_dir(tmp_path, target, kind)
    _write_verdict(tmp_path, overall=2.0)
    assert export_job(_job(tmp_path), target, head_dir) == [tmp_path / "export" / name for name in formats]


def test_a_head_for_a_bf16_target_exports_and_validates(tmp_path):
    """The job's target in bf16 (target.dtype=auto on a CPU with native bf16): the head is checked as the
    export rebuilds it, in its own dtype, not beside a bf16 embedding."""
    model = tiny_llama(num_layers=4, vocab_size=128, hidden_size=32).to(torch.bfloat16)
    target = Target.from_pretrained_model(model, tiny_tokenizer(128))
    head_dir, _ = _head_dir(tmp_path, target)
    _write_verdict(tmp_path, overall=2.0)
    paths = export_job(_job(tmp_path), target, head_dir)
    assert [path.name for path in paths] == ["sglang", "vllm", "speculators"]


def test_the_gate_refuses_without_a_verdict(tmp_path, target):
    head_dir, _ = _head_dir(tmp_path, target)
    with pytest.raises(GateRefused, match="no eval verdict"):
        export_job(_job(tmp_path), target, head_dir)
    assert not (tmp_path / "export").exists()


def test_by_default_every_task_must_beat_the_measured_break_even(tmp_path, target):
    """The old default (overall AL >= 1.1) let a head through that speculation does not pay for."""
    head_dir, _ = _head_dir(tmp_path, target)
    _write_verdict(tmp_path, overall=1.55)  # overall above the break-even 1.5, mt_bench (1.45) below
    with pytest.raises(
        GateRefused,
        match=r"mt_bench AL 1\.450 is not > the break-even 1\.500 \(1 \+ alpha \+ beta .*; set export\.force=true",
    ):
        export_job(_job(tmp_path), target, head_dir)
    assert not (tmp_path / "export").exists()
    _write_verdict(tmp_path, overall=1.6)  # mt_bench 1.5: equal is not above
    with pytest.raises(GateRefused, match=r"mt_bench AL 1\.500 is not >"):
        export_job(_job(tmp_path), target, head_dir)
    _write_verdict(tmp_path, overall=1.65)
    assert export_job(_job(tmp_path, formats=["vllm"]), target, head_dir)


def test_rounds_priced_as_drafted_set_each_tasks_own_break_even(tmp_path, target):
    """An adaptive policy's rounds cost less than full ones: each task's AL is held against the
    mean cost of its own rounds (verdict.break_even_by_task), not against a full round's 1.5."""
    head_dir, _ = _head_dir(tmp_path, target)
    as_drafted = {"mt_bench": 1.25, "gsm8k": 1.5}
    _write_verdict(tmp_path, overall=1.4, break_even_by_task=as_drafted)  # mt_bench 1.3, gsm8k 1.5
    with pytest.raises(
        GateRefused,
        match=r"gsm8k AL 1\.500 \(its rounds cost 1\.500\) is not > the break-even of its rounds as drafted "
        r"\(.*a full round: 1 \+ alpha \+ beta = 1\.500\)",
    ):
        export_job(_job(tmp_path), target, head_dir)
    _write_verdict(tmp_path, overall=1.45, break_even_by_task=as_drafted)  # mt_bench 1.35 < 1.5 passes
    (path,) = export_job(_job(tmp_path, formats=["vllm"]), target, head_dir)
    assert json.loads((path / GATE_FILE).read_text())["gate"]["threshold"] == as_drafted


def test_an_absolute_floor_replaces_the_break_even_and_is_reached_at_equality(tmp_path, target):
    head_dir, _ = _head_dir(tmp_path, target)
    _write_verdict(tmp_path, overall=2.0)
    with pytest.raises(
        GateRefused, match=r"mt_bench AL 1\.900 is not >= 2\.0 \(export\.min_acceptance_length\)"
    ):
        export_job(_job(tmp_path, min_acceptance_length=2.0), target, head_dir)
    (path,) = export_job(_job(tmp_path, formats=["vllm"], min_acceptance_length=1.9), target, head_dir)
    assert json.loads((path / GATE_FILE).read_text())["gate"]["threshold"] == 1.9


def test_a_head_without_measured_costs_needs_a_floor(tmp_path, target):
    head_dir, _ = _head_dir(tmp_path, target, "medusa")
    _write_verdict(tmp_path, overall=2.0, head_kind="medusa", break_even_acceptance_length=None)
    with pytest.raises(
        GateRefused, match="no break-even measured for a medusa head: set export.min_acceptance_length"
    ):
        export_job(_job(tmp_path), target, head_dir)
    assert export_job(_job(tmp_path, formats=["vllm"], min_acceptance_length=1.5), target, head_dir)


def test_a_verdict_about_another_head_is_refused_even_when_forced(tmp_path, target):
    head_dir, _ = _head_dir(tmp_path, target)
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"another head")
    _write_verdict(tmp_path, overall=3.0, head_dir=other)
    for force in (False, True):
        with pytest.raises(GateRefused, match="export the head it evaluated, or evaluate this one"):
            export_job(_job(tmp_path, force=force), target, head_dir)
    assert not (tmp_path / "export").exists()


@pytest.mark.parametrize(
    "identity",
    [
        IdentityCheck(turns=16, plain_mismatches=1, hf_mismatches=0, greedy_pass=False),
        IdentityCheck(turns=16, plain_mismatches=0, hf_mismatches=2, greedy_pass=True),
        IdentityCheck(turns=0, plain_mismatches=0, hf_mismatches=0, greedy_pass=False),
    ],
)
def test_a_verdict_whose_identity_check_failed_is_refused_even_when_forced(tmp_path, target, identity):
    head_dir, _ = _head_dir(tmp_path, target)
    _write_verdict(tmp_path, overall=3.0, identity=identity)
    for force in (False, True):
        with pytest.raises(GateRefused, match="greedy identity failed .*no setting forces this"):
            export_job(_job(tmp_path, force=force), target, head_dir)
    assert not (tmp_path / "export").exists()


def test_hf_generate_is_no_reference_for_a_reduced_precision_target_but_the_plain_loop_is(tmp_path, target):
    """A bf16 eval's HF mismatches are reported in the card, not gated; its plain loop still gates."""
    head_dir, _ = _head_dir(tmp_path, target)
    bf16 = IdentityCheck(
        turns=16, plain_mismatches=0, hf_mismatches=9, greedy_pass=False, hf_is_reference=False
    )
    _write_verdict(tmp_path, overall=2.0, identity=bf16)
    (path,) = export_job(_job(tmp_path, formats=["vllm"]), target, head_dir)
    assert (
        "9 against HF generate (not a reference: the target computes in reduced precision)"
        in (path / "README.md").read_text()
    )
    shutil.rmtree(tmp_path / "export")
    _write_verdict(tmp_path, overall=2.0, identity=replace(bf16, plain_mismatches=1))
    with pytest.raises(GateRefused, match="greedy identity failed"):
        export_job(_job(tmp_path, formats=["vllm"]), target, head_dir)


def test_a_verdict_written_before_hf_is_reference_existed_reads_hf_as_a_reference(tmp_path, target):
    head_dir, _ = _head_dir(tmp_path, target)
    path = _write_verdict(
        tmp_path,
        overall=2.0,
        identity=IdentityCheck(turns=16, plain_mismatches=0, hf_mismatches=2, greedy_pass=False),
    )
    data = json.loads(path.read_text())
    del data["identity"]["hf_is_reference"]
    path.write_text(json.dumps(data))
    assert read_verdict(path).identity.mismatches == 2
    with pytest.raises(GateRefused, match="greedy identity failed"):
        export_job(_job(tmp_path), target, head_dir)


def test_force_exports_below_the_gate_and_records_it_in_the_card_and_gate_json(tmp_path, target):
    head_dir, _ = _head_dir(tmp_path, target)
    _write_verdict(tmp_path, overall=1.05)
    (path,) = export_job(_job(tmp_path, formats=["vllm"], force=True), target, head_dir)
    gate = json.loads((path / "config.json").read_text())["drafter"]["gate"]
    assert gate["forced"] is True and gate["passed"] is False
    assert gate["refusals"] == [
        "gsm8k AL 1.150, mt_bench AL 0.950 are not > the break-even 1.500 (1 + alpha + beta measured by the eval)"
    ]
    assert json.loads((path / GATE_FILE).read_text())["gate"] == gate
    card = (path / "README.md").read_text()
    assert (
        "export gate: FORCED past it: gsm8k AL 1.150, mt_bench AL 0.950 are not > the break-even 1.500"
        in card
    )
    assert (
        "WARNING: exported with export.force=true although the eval gate refused it: gsm8k AL 1.150" in card
    )


def test_a_forced_export_without_a_verdict_says_it_was_not_evaluated(tmp_path, target):
    head_dir, _ = _head_dir(tmp_path, target)
    (path,) = export_job(_job(tmp_path, formats=["vllm"], force=True), target, head_dir)
    record = json.loads((path / GATE_FILE).read_text())
    assert record["verdict"] is None and record["gate"]["forced"] is True
    assert "| eval verdict | NONE: exported without an eval (forced)" in (path / "README.md").read_text()


def test_force_passing_the_gate_is_not_recorded_as_forced(tmp_path, target):
    head_dir, _ = _head_dir(tmp_path, target)
    _write_verdict(tmp_path, overall=3.0)
    (path,) = export_job(_job(tmp_path, formats=["sglang"], force=True), target, head_dir)
    assert json.loads((path / "config.json").read_text())["drafter"]["gate"]["forced"] is False


def test_a_format_the_head_has_not_is_refused_before_anything_is_written(tmp_path, target):
    head_dir, _ = _head_dir(tmp_path, target, kind="eagle1")
    _write_verdict(tmp_path, overall=2.0)
    with pytest.raises(ValueError, match="'sglang' does not exist for a 'eagle1' head"):
        export_job(_job(tmp_path, formats=["vllm", "sglang"]), target, head_dir)
    assert not (tmp_path / "export").exists()


def _confidence_stand_in(directory):
    save_file({"weight": torch.randn(1, 129)}, str(directory / CONFIDENCE_WEIGHTS))
    (directory / CONFIDENCE_CONFIG).write_text(json.dumps({"kind": "confidence", "hidden_size": 64}))


def test_confidence_files_travel_with_every_export_where_no_engine_loader_looks(tmp_path, target):
    head_dir, _ = _head_dir(tmp_path, target)
    _confidence_stand_in(head_dir)
    _write_verdict(tmp_path, overall=2.0)
    for path in export_job(_job(tmp_path), target, head_dir):
        # vLLM globs <dir>/*.safetensors: the drafter's weights file must be the only one there.
        assert [p.name for p in path.glob("*.safetensors")] == [layout_for("eagle3", path.name).weights_file]
        for name in (CONFIDENCE_WEIGHTS, CONFIDENCE_CONFIG):
            assert (path / EXPORT_FOLDER / name).read_bytes() == (head_dir / name).read_bytes()
        record = json.loads((path / "config.json").read_text())["drafter"]["confidence"]
        assert record["weights"] == f"{EXPORT_FOLDER}/{CONFIDENCE_WEIGHTS}"
        assert set(record["sha256"]) == {
            f"{EXPORT_FOLDER}/{n}" for n in (CONFIDENCE_WEIGHTS, CONFIDENCE_CONFIG)
        }
        assert f"{EXPORT_FOLDER}/{CONFIDENCE_WEIGHTS}" in (path / "README.md").read_text()
        imported = import_to_head_dir(
            path, path.name, TargetWeights.from_target(target), tmp_path / path.name
        )
        for name in (CONFIDENCE_WEIGHTS, CONFIDENCE_CONFIG):  # back beside the drafter
            assert (imported / name).read_bytes() == (head_dir / name).read_bytes()


def test_an_export_with_a_second_weights_file_at_its_top_is_refused(tmp_path):
    weights = target_weights()
    head = make_head("eagle3", weights)
    out = export_head(head, layout_for("eagle3", "vllm"), tmp_path / "out", meta(), weights)
    save_file({"linear.weight": torch.zeros(1, 129)}, str(out / "extra.safetensors"))
    with pytest.raises(ValueError, match=r"\['extra.safetensors'\] beside model.safetensors"):
        validate_export(out, layout_for("eagle3", "vllm"), head, weights)


def test_a_tampered_or_half_confidence_head_is_caught(tmp_path):
    weights = target_weights()
    head = make_head("eagle3", weights)
    head_dir = tmp_path / "head"
    head_dir.mkdir()
    (head_dir / CONFIDENCE_CONFIG).write_text("{}")
    with pytest.raises(ValueError, match=CONFIDENCE_WEIGHTS):
        export_head(head, layout_for("eagle3", "vllm"), tmp_path / "out", meta(), weights, head_dir)
    _confidence_stand_in(head_dir)
    out = export_head(head, layout_for("eagle3", "vllm"), tmp_path / "out", meta(), weights, head_dir)
    save_file({"weight": torch.zeros(1, 129)}, str(out / EXPORT_FOLDER / CONFIDENCE_WEIGHTS))
    with pytest.raises(ValueError, match="not the confidence file that was exported"):
        validate_export(out, layout_for("eagle3", "vllm"), head, weights)


def test_cli_exports_and_imports(tmp_path):
    model, tokenizer = tiny_llama(num_layers=4, vocab_size=128, hidden_size=32), tiny_tokenizer(128)
    target_dir = tmp_path / "target"
    model.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    weights = TargetWeights.from_model(model)
    head = make_head("eagle3", weights)
    head.save_pretrained(tmp_path / "head")
    common = ["--target", str(target_dir), "--format", "speculators"]
    with pytest.raises(ValueError, match="no eval verdict"):
        main(["--head", str(tmp_path / "head"), *common, "--out", str(tmp_path / "spec")])
    verdict_flag = ["--verdict", str(_write_verdict(tmp_path, overall=1.05))]
    export = ["--head", str(tmp_path / "head"), *common, "--out", str(tmp_path / "spec"), *verdict_flag]
    # The tool's default gate is the job's, and its message names the tool's own flags.
    with pytest.raises(ValueError, match=r"not > the break-even 1\.500 .*; set --force to export"):
        main(export)
    with pytest.raises(ValueError, match=r"mt_bench AL 0\.950 is not >= 1\.0 \(--min-acceptance-length\)"):
        main([*export, "--min-acceptance-length", "1.0"])
    _write_verdict(tmp_path, overall=2.0)

    out = main(export)
    assert (
        json.loads((out / "config.json").read_text())["drafter"]["verdict"]["overall_acceptance_length"]
        == 2.0
    )

    ours = main(["import", "--path", str(out), *common, "--out", str(tmp_path / "imported")])
    imported = load_head(ours, embed_weight=weights.embed_weight)
    original, reread = (
        trained_state(head, head.frozen_weights),
        trained_state(imported, imported.frozen_weights),
    )
    assert all(same_bytes(original[name], reread[name]) for name in original)
    assert load_file(str(ours / "model.safetensors")).keys() == original.keys()


def _variant_head_dir(run_dir, target):
    weights = TargetWeights.from_target(target)
    base = make_head("eagle3", weights)
    variant = Eagle3Variant(norm_before_fc=True, norm_before_residual=True, norm_output=True)
    head = Eagle3Head(
        replace(base.args, variant=variant), weights.embed_weight, DraftVocab(base.d2t, base.t2d, 1.0)
    )
    head.save_pretrained(run_dir / "head")
    return run_dir / "head", head


def test_a_variant_head_exports_only_to_the_layouts_that_carry_it(tmp_path, target, caplog):
    head_dir, head = _variant_head_dir(tmp_path, target)
    _write_verdict(tmp_path, overall=2.0)
    assert export_job(_job(tmp_path), target, head_dir) == [tmp_path / "export" / "speculators"]
    assert "no sglang layout" in caplog.text and "no vllm layout" in caplog.text
    config = json.loads((tmp_path / "export" / "speculators" / "config.json").read_text())
    assert (config["norm_before_fc"], config["norm_before_residual"], config["norm_output"]) == (
        True,
        True,
        True,
    )
    with pytest.raises(CannotExpress, match="norm_before_fc"):
        export_job(_job(tmp_path, formats=["vllm"]), target, head_dir)


def test_local_verifier_names_the_directory_the_target_was_loaded_from(tmp_path, target):
    head_dir, _ = _head_dir(tmp_path, target)
    _write_verdict(tmp_path, overall=2.0)
    target.model_dir = str(tmp_path / "model")
    export_job(_job(tmp_path, formats=["speculators"], local_verifier=True), target, head_dir)
    config = json.loads((tmp_path / "export" / "speculators" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(tmp_path / "model")
    assert config["drafter"]["target"]["local_path"] == str(tmp_path / "model")
    export_job(_job(tmp_path, formats=["speculators"]), target, head_dir)
    config = json.loads((tmp_path / "export" / "speculators" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "tiny-llama"
    target.model_dir = None
    with pytest.raises(ValueError, match="not loaded from a directory"):
        export_job(_job(tmp_path, formats=["speculators"], local_verifier=True), target, head_dir)
