from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from train.run import run


def head_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "head" / "model.safetensors")


def test_default_job_trains_and_saves_an_eagle3_head(make_job, tmp_path):
    results = run(make_job())
    weights = head_weights(tmp_path / "run")
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight", "d2t", "t2d"} <= set(weights)
    assert weights["lm_head.weight"].shape[0] == 512
    assert Path(results["head_dir"]).is_dir()


@pytest.mark.parametrize("kind", ["eagle1", "medusa"])
def test_other_head_kinds_train(make_job, tmp_path, kind):
    run(make_job(f"head={kind}", "train.max_steps=2", "train.checkpoint_every=100"))
    weights = head_weights(tmp_path / "run")
    assert weights, kind
    assert (tmp_path / "run" / "head" / "head_config.json").read_text().count(kind)


def test_killed_job_resumes_to_the_same_weights_as_an_uninterrupted_run(make_job, tmp_path, monkeypatch):
    run(make_job(run_dir=tmp_path / "straight"))
    straight = head_weights(tmp_path / "straight")

    import train.trainer as trainer

    real_save = trainer.save_checkpoint

    def save_then_die(accelerator, root, state, **kw):
        path = real_save(accelerator, root, state, **kw)
        if state.step == 3:
            raise KeyboardInterrupt("killed after the step-3 checkpoint")
        return path

    monkeypatch.setattr(trainer, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        run(make_job(run_dir=tmp_path / "killed"))
    assert not (tmp_path / "killed" / "head").exists()
    monkeypatch.setattr(trainer, "save_checkpoint", real_save)
    run(make_job(run_dir=tmp_path / "killed"))
    resumed = head_weights(tmp_path / "killed")
    assert resumed.keys() == straight.keys()
    for name in straight:
        torch.testing.assert_close(resumed[name], straight[name], rtol=0, atol=0, msg=name)


def test_resume_refuses_a_checkpoint_of_another_head_kind(make_job, tmp_path):
    run(make_job("train.max_steps=3"))
    with pytest.raises(ValueError, match="checkpoint of a 'eagle3' head, but head.kind='medusa'"):
        run(make_job("head=medusa", "train.max_steps=6"))


def test_offline_hidden_states_give_the_same_loss_as_online(make_job, tmp_path):
    from train.batches import pad_rows
    from train.objectives import build_objective
    from train.trainer import FeatureSource
    from data.hidden_cache import HiddenCache, build_hidden_cache
    from data.prepare import prepare_dataset
    from heads.target import Target

    job = make_job()
    target = Target.load(job.target)
    prepared = prepare_dataset(job.data, target.tokenizer, tmp_path / "data")
    torch.manual_seed(0)
    objective = build_objective(job.head, target, prepared.train, job.train)
    rows = [0, 3]
    build_hidden_cache(target, prepared.train, objective.layer_ids, tmp_path / "cache", rows_per_shard=4)
    cache = HiddenCache(tmp_path / "cache", target, objective.layer_ids, len(prepared.train))
    batch = pad_rows([prepared.train[i] for i in rows], target.tokenizer.pad_token_id)
    online, _ = objective(FeatureSource(target, objective.layer_ids, None)(rows, batch))
    offline, _ = objective(FeatureSource(target, objective.layer_ids, cache)(rows, batch))
    assert torch.isfinite(online)
    torch.testing.assert_close(offline, online)


def test_offline_mode_trains_and_the_cache_is_reused(make_job, tmp_path):
    run(make_job("train.hidden_states=offline", "train.max_steps=2"))
    manifest = (tmp_path / "run" / "hidden_cache" / "manifest.json").read_text()
    assert '"bytes"' in manifest
    assert head_weights(tmp_path / "run")


def test_non_finite_losses_are_skipped_then_stop_the_run(make_job, tmp_path, monkeypatch):
    import train.objectives as objectives

    real_forward = objectives.Eagle3Objective.forward
    calls = {"n": 0}

    def poisoned(self, feats):
        loss, metrics = real_forward(self, feats)
        calls["n"] += 1
        if self.training and calls["n"] in (2, 4, 5, 6):
            loss = loss * float("nan")
            metrics = {**metrics, "loss": loss}
        return loss, metrics

    monkeypatch.setattr(objectives.Eagle3Objective, "forward", poisoned)
    with pytest.raises(RuntimeError, match="3 consecutive non-finite losses"):
        run(make_job("train.max_steps=20", "train.val_every=100", "train.checkpoint_every=100"))


def test_a_failed_checkpoint_write_leaves_the_previous_one_valid(make_job, tmp_path, monkeypatch):
    from accelerate import Accelerator

    from train.checkpoint import find_resume_dir

    real_save_state = Accelerator.save_state

    def disk_full(self, output_dir=None, **kw):
        if "step_00000006" in str(output_dir):
            raise OSError(28, "No space left on device")
        return real_save_state(self, output_dir, **kw)

    monkeypatch.setattr(Accelerator, "save_state", disk_full)
    with pytest.raises(OSError, match="No space"):
        run(make_job())
    latest = find_resume_dir("auto", tmp_path / "run" / "checkpoints")
    assert latest is not None and latest.name == "step_00000003"
