import json
from pathlib import Path

import pytest

from train.run import run


@pytest.mark.integration
def test_the_jobs_export_stage_exports_the_trained_head(make_job, tmp_path):
    """prepare -> train -> export through train/run.py (no eval stage here: force past the gate)."""
    job = make_job("stages=[prepare,train,export]", "export.force=true", run_dir=tmp_path / "run")
    exports = [Path(path) for path in run(job)["exports"]]
    assert exports == [tmp_path / "run" / "export" / name for name in ("sglang", "vllm", "speculators")]
    for path in exports:
        drafter = json.loads((path / "config.json").read_text())["drafter"]
        assert drafter["gate"]["forced"] is True
        assert drafter["target"]["layer_ids"]["ours_output_of_layer"] == [0, 1, 2]


@pytest.mark.integration
def test_an_eagle1_job_exports_with_the_default_export_settings(make_job, tmp_path):
    """The README's `head=eagle1` job used to stop at export: the default formats were EAGLE-3's."""
    job = make_job(
        "head=eagle1", "stages=[prepare,train,export]", "export.force=true", run_dir=tmp_path / "run"
    )
    assert [Path(path).name for path in run(job)["exports"]] == ["vllm"]


def test_a_refusing_gate_ends_the_job_with_its_summary_not_a_traceback(make_job, tmp_path, capsys):
    """A head that does not pay is a result: no export, the reasons, and how to get past the gate."""
    job = make_job("stages=[prepare,train,eval,export]", "eval.prompts_per_task=2", "eval.max_new_tokens=6")
    results = run(job)  # the tiny random head does not beat its measured break-even
    assert results["exports"] == [] and not (tmp_path / "run" / "export").exists()
    assert results["gate"].startswith("export refused: ") and " not > the break-even " in results["gate"]
    out = capsys.readouterr().out
    summary = out[out.index("Summary:") :]
    assert "export refused: " in summary and "exports  none" in summary
    assert "next     a longer run" in summary and "the same command with export.force=true" in summary
    assert json.loads((tmp_path / "run" / "results.json").read_text())["gate"] == results["gate"]
