"""A rerun of a finished job reuses its eval and export while their inputs are unchanged."""

import json

import pytest

import eval.run
import heads.export
from heads.registry import head_digest
from train.reuse import changed_keys
from train.run import run


@pytest.fixture
def prompts_jsonl(tmp_path):
    path = tmp_path / "prompts.jsonl"
    turns = ["the cat sat", "a dog ran under the table", "red blue red", "one two three four"]
    rows = [
        {"task": "toy", "id": str(i), "category": "chat", "turns": [turn]} for i, turn in enumerate(turns)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _job(make_job, prompts_jsonl, *extra):
    return make_job(
        f"eval.tasks=[{prompts_jsonl}]",
        "eval.prompts_per_task=2",
        "eval.max_new_tokens=6",
        "eval.draft_length=2",
        "eval.calibration_prompts_per_task=1",
        "eval.calibration_report_prompts_per_task=1",
        "export.force=true",
        "stages=[prepare,train,eval,export]",
        *extra,
    )


def _fail(*args, **kwargs):
    raise AssertionError("this stage should have been reused")


def test_a_rerun_reuses_eval_and_export_and_a_changed_setting_reruns_what_depends_on_it(
    make_job, prompts_jsonl, tmp_path, monkeypatch, capsys
):
    first = run(_job(make_job, prompts_jsonl))
    head_dir = tmp_path / "run" / "head"
    trained = head_digest(head_dir)
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    calibrated = report["head"]["calibrated_dir"]
    assert calibrated == str(tmp_path / "run" / "eval" / "calibrated_head")
    exported = json.loads(
        (tmp_path / "run" / "export" / "vllm" / "confidence" / "confidence_config.json").read_text()
    )
    assert exported == json.loads(
        (tmp_path / "run" / "eval" / "calibrated_head" / "confidence_config.json").read_text()
    )
    assert "Summary: eagle3 head" in capsys.readouterr().out

    monkeypatch.setattr(eval.run, "evaluate", _fail)
    monkeypatch.setattr(heads.export, "export_job", _fail)
    second = run(_job(make_job, prompts_jsonl))
    out = capsys.readouterr().out
    assert f"eval: reused {tmp_path / 'run' / 'eval'} (head {trained[:12]}, settings unchanged)" in out
    assert "export: reused" in out and "Summary: eagle3 head" in out
    assert second["eval_report"] == first["eval_report"] and second["exports"] == first["exports"]
    assert head_digest(head_dir) == trained  # neither training's rerun nor the eval rewrote it

    monkeypatch.undo()
    monkeypatch.setattr(eval.run, "evaluate", _fail)
    run(_job(make_job, prompts_jsonl, "export.min_acceptance_length=1.0"))
    out = capsys.readouterr().out
    assert "eval: reused" in out and "export: rerun (changed: export.min_acceptance_length)" in out

    monkeypatch.undo()
    run(_job(make_job, prompts_jsonl, "export.min_acceptance_length=1.0", "eval.max_new_tokens=5"))
    out = capsys.readouterr().out
    assert "eval: rerun (changed: eval.max_new_tokens)" in out and "export: rerun (changed: verdict)" in out
    assert (
        json.loads((tmp_path / "run" / "eval" / "report.json").read_text())["settings"]["max_new_tokens"] == 5
    )


def test_reuse_false_reruns_a_finished_eval(make_job, prompts_jsonl, monkeypatch):
    run(_job(make_job, prompts_jsonl, "stages=[prepare,train,eval]"))
    monkeypatch.setattr(eval.run, "evaluate", _fail)
    with pytest.raises(AssertionError, match="should have been reused"):
        run(_job(make_job, prompts_jsonl, "stages=[prepare,train,eval]", "reuse=false"))


def test_changed_keys_names_the_leaves_that_differ():
    old = {"eval": {"draft_length": 4, "tasks": ["a"]}, "head": "x"}
    assert changed_keys(old, {"eval": {"draft_length": 8, "tasks": ["a"]}, "head": "x"}) == [
        "eval.draft_length"
    ]
    assert changed_keys(old, {"eval": {"draft_length": 4, "tasks": ["a", "b"]}}) == ["eval.tasks", "head"]
