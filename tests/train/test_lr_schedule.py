"""The learning-rate schedules: linear warm-up, then cosine / linear / constant to max_steps."""

import math

import pytest
import torch

from train.config import TrainConfig
from train.trainer import check_train_config, lr_schedule


def _lrs(schedule: str, warmup: int, total: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    scheduler = lr_schedule(optimizer, schedule, warmup, total)
    lrs = []
    for _ in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_warm_up_then_the_schedule(schedule):
    lrs = _lrs(schedule, warmup=4, total=14)
    assert lrs[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    after = {
        "cosine": [1 + math.cos(math.pi * i / 10) for i in range(10)],
        "linear": [2 * (1 - i / 10) for i in range(10)],
        "constant": [2.0] * 10,
    }[schedule]
    assert lrs[4:] == pytest.approx(after)


def test_an_unknown_schedule_is_refused_by_name():
    with pytest.raises(ValueError, match="train.lr_schedule='step'.*constant"):
        check_train_config(TrainConfig(lr_schedule="step"))
