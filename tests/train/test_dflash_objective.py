"""The block drafter's objective: what head=dflash builds and trains, on a tiny target."""

import pytest
import torch

from heads.target import Target
from tests.helpers import tiny_llama, tiny_tokenizer
from tests.train.test_confidence import features, head_config, tiny_target
from train.config import TrainConfig
from train.objectives import build_objective, mask_token_id

TRAIN = TrainConfig(loss_chunk_tokens=7, lr=3e-3)


def test_the_block_objective_trains_its_slots_and_reports_their_acceptance():
    target = tiny_target()
    torch.manual_seed(0)
    cfg = head_config("dflash", confidence=False, block_size=4, max_anchors=6)
    objective = build_objective(cfg, target, None, TRAIN)
    feats = features(target, objective.layer_ids)
    optimizer = torch.optim.AdamW(objective.parameters(), lr=TRAIN.lr)
    losses = []
    for _ in range(40):
        loss, metrics = objective(feats)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert {"acc_0", "acc_2", "loss_2", "acceptance_length"} <= set(metrics)
    assert 1 <= metrics["acceptance_length"].item() <= 4
    # Fitting 2 rows of 12 tokens: measured 15.7 -> 0.5 over 40 steps; half the start is a loose bound.
    assert sum(losses[-5:]) / 5 < losses[0] / 2


def test_block_drafters_refuse_a_confidence_head():
    with pytest.raises(ValueError, match="no confidence head"):
        build_objective(head_config("dflash", confidence=True), tiny_target(), None, TRAIN)


def test_the_mask_token_is_chosen_where_the_target_does_not_write():
    target = tiny_target()  # its tokenizer: <unk> <|im_start|> <|im_end|> <pad>, then words; no mask token
    assert mask_token_id(head_config("dflash", mask_token_id=7), target) == 7
    assert mask_token_id(head_config("dflash"), target) == target.vocab_size - 1  # every special frames chats
    tokenizer = tiny_tokenizer(60)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<spare>"]})  # id 60 of 64
    with_spare = Target.from_pretrained_model(
        tiny_llama(num_layers=4, vocab_size=64, hidden_size=32), tokenizer
    )
    assert mask_token_id(head_config("dflash"), with_spare) == 60
