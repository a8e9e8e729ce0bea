"""Resume skips a checkpoint that lost a file, naming it, and refuses when none is complete."""

import json
import logging

import pytest

from train.checkpoint import FILES, STATE_FILE, find_resume_dir, list_files


def _checkpoint(root, step: int, files: dict[str, bytes] | None = None):
    path = root / f"step_{step:08d}"
    path.mkdir(parents=True)
    for name, content in (files or {"model.safetensors": b"weights", "optimizer.bin": b"adam"}).items():
        (path / name).write_bytes(content)
    (path / FILES).write_text(json.dumps(list_files(path)))
    (path / STATE_FILE).write_text("{}")
    return path


def test_resume_falls_back_to_the_newest_complete_checkpoint_and_names_the_incomplete_one(tmp_path, caplog):
    older, newer = _checkpoint(tmp_path, 3), _checkpoint(tmp_path, 6)
    assert find_resume_dir("auto", tmp_path) == newer
    (newer / "optimizer.bin").unlink()
    with caplog.at_level(logging.WARNING):
        assert find_resume_dir("auto", tmp_path) == older
    assert f"checkpoint {newer} is incomplete (missing or cut short: optimizer.bin)" in caplog.text
    (older / "model.safetensors").write_bytes(b"cut")  # a file cut short counts as missing
    with pytest.raises(FileNotFoundError, match="no complete checkpoint .* train.resume=never"):
        find_resume_dir("auto", tmp_path)
    with pytest.raises(
        FileNotFoundError, match="incomplete checkpoint, missing or cut short: model.safetensors"
    ):
        find_resume_dir(str(older), tmp_path)
    assert find_resume_dir("never", tmp_path) is None


def test_a_checkpoint_from_before_the_file_list_counts_as_complete(tmp_path):
    path = _checkpoint(tmp_path, 3)
    (path / FILES).unlink()
    assert find_resume_dir("auto", tmp_path) == path
    assert find_resume_dir("auto", tmp_path / "nothing") is None


def test_a_real_run_whose_newest_checkpoint_lost_its_optimizer_resumes_from_the_one_before(
    make_job, tmp_path, caplog
):
    from train.run import run

    run(make_job())
    checkpoints = tmp_path / "run" / "checkpoints"
    newest = checkpoints / "step_00000006"
    assert {"optimizer.bin", "model.safetensors"} <= set(json.loads((newest / FILES).read_text()))
    (newest / "optimizer.bin").unlink()
    with caplog.at_level(logging.INFO):
        run(make_job())
    assert f"checkpoint {newest} is incomplete (missing or cut short: optimizer.bin)" in caplog.text
    assert f"resumed from {checkpoints / 'step_00000003'} at step 3" in caplog.text
    assert (newest / "optimizer.bin").is_file()  # step 6 trained again and saved whole
    # The confidence head's embedding is the target's, never saved: no duplicate for accelerate to drop.
    assert "Removed shared tensor" not in caplog.text
