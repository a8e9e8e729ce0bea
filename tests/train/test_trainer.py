import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.train.runs import expected_tokens, wandb_history
from train.run import run


def head_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "head" / "model.safetensors")


def test_default_job_trains_and_saves_an_eagle3_head(make_job, tmp_path):
    results = run(make_job())
    weights = head_weights(tmp_path / "run")
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight", "d2t", "t2d"} <= set(weights)
    assert weights["lm_head.weight"].shape[0] == 512
    assert Path(results["head_dir"]).is_dir()


def test_the_confidence_recipe_fits_a_head_to_a_frozen_drafter_on_later_conversations(make_job, tmp_path):
    from heads.confidence import CONFIG_FILE, WEIGHTS_FILE

    run(make_job("head.confidence=false", "data.max_conversations=20", run_dir=tmp_path / "drafter"))
    confidence = make_job(
        "train=confidence",
        "train.max_steps=3",
        "head.confidence_training=frozen",
        f"head.confidence_drafter={tmp_path / 'drafter' / 'head'}",
        "data.skip_conversations=20",
        run_dir=tmp_path / "confidence",
    )
    results = run(confidence)
    head_dir = tmp_path / "confidence" / "head"
    assert (head_dir / CONFIG_FILE).is_file() and (head_dir / WEIGHTS_FILE).is_file()
    torch.testing.assert_close(
        head_weights(tmp_path / "confidence"), head_weights(tmp_path / "drafter")
    )  # frozen
    manifest = json.loads((Path(results["data_dir"]) / "manifest.json").read_text())
    assert manifest["counts"]["skipped"] == {"data.skip_conversations": 20}
    assert manifest["counts"]["kept"] == 20  # the 40 chats minus the drafter's 20


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
    with (tmp_path / "killed" / "val_metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 5, "tokens": 0}) + "\n")  # a validation past the checkpoint
    monkeypatch.setattr(trainer, "save_checkpoint", real_save)
    run(make_job(run_dir=tmp_path / "killed"))
    resumed = head_weights(tmp_path / "killed")
    validations = (tmp_path / "killed" / "val_metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in validations] == [0, 3, 6]  # each once
    assert resumed.keys() == straight.keys()
    for name in straight:
        torch.testing.assert_close(resumed[name], straight[name], rtol=0, atol=0, msg=name)


def test_resume_refuses_a_checkpoint_of_another_head_kind(make_job, tmp_path):
    run(make_job("train.max_steps=3"))
    with pytest.raises(ValueError, match="checkpoint of a 'eagle3' head, but head.kind='medusa'"):
        run(make_job("head=medusa", "train.max_steps=6"))


def test_offline_hidden_states_give_the_same_loss_as_online(make_job, tmp_path):
    from data.hidden_cache import HiddenCache, build_hidden_cache
    from data.prepare import prepare_dataset
    from heads.target import Target
    from train.batches import pad_rows
    from train.objectives import build_objective
    from train.trainer import FeatureSource

    job = make_job()
    target = Target.load(job.target)
    prepared = prepare_dataset(job.data, target.tokenizer, tmp_path / "data")
    torch.manual_seed(0)
    objective = build_objective(job.head, target, prepared.train, job.train)
    rows = [0, 3]
    build_hidden_cache(target, prepared.train, objective.layer_ids, tmp_path / "cache", rows_per_shard=4)
    cache = HiddenCache(tmp_path / "cache", target, objective.layer_ids, prepared.train)
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


def test_wandb_offline_run_holds_the_training_metrics(make_job, tmp_path):
    job = make_job("wandb.mode=offline", "train.max_steps=4")
    run(job)
    history = wandb_history(tmp_path / "run")
    train_rows = [r for r in history if "train/loss" in r]
    assert [r["_step"] for r in train_rows] == [1, 2, 3, 4]
    for key in [
        "train/loss",
        "train/acc_0",
        "train/acc_2",
        "train/tokens_per_s",
        "train/lr",
        "train/grad_norm",
    ]:
        assert all(key in r for r in train_rows), key
    assert any("val/acc_0" in r for r in history)
    assert [r["train/tokens"] for r in train_rows] == expected_tokens(job, world=1, steps=4)


def test_a_job_without_a_validation_split_trains(make_job, tmp_path):
    run(make_job("data.val_fraction=0", "train.max_steps=2"))
    assert head_weights(tmp_path / "run")


def test_validation_metrics_are_written_for_learning_curves(make_job, tmp_path):
    run(make_job("train.max_steps=6", "train.val_every=3"))
    lines = [json.loads(line) for line in (tmp_path / "run" / "val_metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 3, 6]  # 0: the head training starts from
    assert lines[0]["tokens"] == 0 < lines[1]["tokens"] < lines[2]["tokens"]
    assert all("val/acc_0" in line and "val/loss" in line for line in lines)


def test_a_head_started_from_the_target_layer_trains(make_job, tmp_path):
    run(make_job("head.init=target_layer", "train.max_steps=2"))
    assert (tmp_path / "run" / "head" / "model.safetensors").is_file()
    with pytest.raises(ValueError, match="head.init=target_layer is for EAGLE-3"):
        run(make_job("head=medusa", "head.init=target_layer", run_dir=tmp_path / "medusa"))
    with pytest.raises(ValueError, match="head.init=.zeros.: choose random, target_layer, release"):
        run(make_job("head.init=zeros", run_dir=tmp_path / "zeros"))


def test_an_eagle3_variant_trains_and_is_saved_with_the_head(make_job, tmp_path):
    run(make_job("head.variant.norm_before_fc=true", "head.variant.norm_output=true", "train.max_steps=2"))
    config = json.loads((tmp_path / "run" / "head" / "head_config.json").read_text())
    assert config["args"]["variant"]["norm_before_fc"] and config["args"]["variant"]["norm_output"]
    assert "input_norm.weight" in head_weights(tmp_path / "run")
    with pytest.raises(ValueError, match="head.variant .* is for EAGLE-3 heads"):
        run(make_job("head=medusa", "head.variant.norm_output=true", run_dir=tmp_path / "medusa"))


def test_head_snapshots_are_saved_for_learning_curves(make_job, tmp_path):
    run(make_job("train.max_steps=6", "train.snapshot_every=3"))
    snapshots = tmp_path / "run" / "snapshots"
    assert sorted(p.name for p in snapshots.iterdir()) == ["step-3", "step-6"]
    final, last = head_weights(tmp_path / "run"), load_file(snapshots / "step-6" / "model.safetensors")
    assert all(torch.equal(final[k], last[k]) for k in final)  # the final head is the last snapshot
    early = load_file(snapshots / "step-3" / "model.safetensors")
    assert not torch.equal(early["fc.weight"], final["fc.weight"])
    assert (snapshots / "step-3" / "target.json").is_file()


def test_a_head_can_start_from_a_trained_one(make_job, tmp_path, caplog):
    caplog.set_level("INFO")
    run(make_job("train.max_steps=2", run_dir=tmp_path / "first"))
    first = tmp_path / "first" / "head"
    run(make_job(f"head.init={first}", "train.max_steps=2", "train.lr=0", run_dir=tmp_path / "warm"))
    start, end = load_file(first / "model.safetensors"), head_weights(tmp_path / "warm")
    assert start.keys() == end.keys() and all(torch.equal(start[k], end[k]) for k in start)  # lr 0: unchanged
    # Its confidence head starts from the trained one too, not from a fresh (constant 0.5) head.
    start, end = (load_file(d / "confidence.safetensors") for d in (first, tmp_path / "warm" / "head"))
    assert start["linear.weight"].abs().sum() > 0
    assert all(torch.equal(start[k], end[k]) for k in start)
    assert f"confidence head starts from the one in {first}" in caplog.text
    run(make_job("head.init=release", "train.max_steps=1", run_dir=tmp_path / "release"))
    assert "heads/release/ ships no eagle3 head for this target; random start" in caplog.text
    with pytest.raises(ValueError, match="holds a 'eagle3' head, but head.kind='medusa'"):
        run(make_job("head=medusa", f"head.init={first}", run_dir=tmp_path / "medusa"))
    with pytest.raises(ValueError, match="a trained head directory"):
        run(make_job(f"head.init={tmp_path / 'nowhere'}", run_dir=tmp_path / "bad"))


@pytest.mark.parametrize("native", [False, True])
def test_auto_precision_is_bf16_only_where_the_machine_runs_it_natively(make_job, monkeypatch, native):
    import heads.machine
    import train.trainer as trainer

    monkeypatch.setattr(heads.machine, "native_bf16", lambda device: native)
    seen = []

    def record(job):  # the precision the job's accelerator would be built with; the run stops there
        seen.append(job.train.precision)
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "make_accelerator", record)
    with pytest.raises(KeyboardInterrupt):
        run(make_job("train.precision=auto"))
    assert seen == ["bf16" if native else "fp32"]
