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
