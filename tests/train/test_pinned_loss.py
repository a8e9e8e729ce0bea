"""Pinned losses (torchtune style): four steps of the EAGLE-3 recipe (the trainer's own setup and
train_step, the default head with its joint confidence head) on the embedded SmolLM2-135M target
and four fixed chats must give the per-step losses recorded below. Step 1 pins the head's
initialisation, the TTT unroll and the losses; steps 2-4 add the optimizer, clipping and the
schedule. A change meant to leave the maths alone must leave them where they are; one that
changes the maths on purpose re-pins them (print recipe_losses' result) and says why."""

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from data.chat_template import ChatEncoder
from train.checkpoint import TrainerState
from train.config import register_configs
from train.trainer import build_features, make_accelerator, setup, train_step

CONF = Path(__file__).resolve().parents[2] / "conf"

CHATS = [
    ("Name three primary colours.", "Red, yellow and blue are the three primary colours."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Give me a word that rhymes with cat.", "Hat rhymes with cat, and so do bat and mat."),
    ("How many legs does a spider have?", "A spider has eight legs."),
]

# Per-step train/loss (drafter TTT loss + confidence BCE), fp32 on an AVX2 CPU, torch 2.13.
PINNED = [26.076862335205078, 30.68783950805664, 24.276506423950195, 14.817520141601562]
# Measured: 1 and 2 threads and repeated runs gave bit-identical losses; perturbing the fresh
# head's weights by one fp32 rounding (relative 2^-23) moved them by at most 1.3e-7 (relative),
# a proxy for another CPU's summation order. 1e-5 leaves ~75x room for that, and is far below
# what a real change does: train.lr 1% higher moves step 2 by 7e-3 (relative), and the losses
# change by 15-40% from one step to the next.
RTOL = 1e-5


def _job(tmp_path: Path, *overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                "target.device=cpu",
                "target.dtype=float32",  # as pinned, on any CPU (auto is bf16 where it has native bf16)
                "head.init=random",  # not the shipped head: retraining it must not move the pins
                "head.draft_vocab_size=1024",
                "train.ttt_steps=3",
                "train.batch_size=2",
                "train.group_by_length=false",  # the rows of each step as pinned (data order, not maths)
                f"train.max_steps={len(PINNED)}",
                "train.warmup_steps=1",
                "train.lr=1e-3",  # as pinned, whatever the main job's default
                "train.precision=fp32",
                "wandb.mode=disabled",
                f"run_dir={tmp_path}",
                *overrides,
            ],
        )
    return OmegaConf.to_object(cfg)


def recipe_losses(target, tmp_path: Path, *overrides: str) -> list[float]:
    """The loss of each of train.max_steps steps of the recipe on CHATS (any override as on the
    command line)."""
    job = _job(tmp_path, *overrides)
    encoder = ChatEncoder(target.tokenizer, max_length=job.data.max_length)
    encoded = [
        encoder.encode([{"role": "user", "content": q}, {"role": "assistant", "content": a}])
        for q, a in CHATS
    ]
    rows = Dataset.from_dict(
        {
            "input_ids": [e.input_ids.tolist() for e in encoded],
            "loss_mask": [e.loss_mask.tolist() for e in encoded],
        }
    )
    run = setup(job, make_accelerator(job), target, rows, rows.select([]), None)
    build_features(run)
    state = TrainerState(0, 0, 0, job.head.kind, run.head_args, {})
    losses = []
    for _ in range(job.train.max_steps):
        losses.append(train_step(run, state)["loss"])
        state.step += 1
    return torch.stack(losses).tolist()  # one host sync, after the run


@pytest.mark.integration
def test_eagle3_recipe_losses_on_the_embedded_target_match_the_pinned_values(smollm2, tmp_path):
    losses = recipe_losses(smollm2, tmp_path)
    assert losses == pytest.approx(PINNED, rel=RTOL, abs=0), losses
