import torch

from train.batches import BatchPlan, pad_rows


def test_every_row_is_used_once_per_epoch_across_ranks_and_micro_batches():
    plan = BatchPlan(num_rows=24, batch_size=2, grad_accum=3, world=2, seed=5)
    seen = [
        r
        for step in range(2)
        for micro in range(3)
        for rank in range(2)
        for r in plan.rows(step, micro, rank)
    ]
    assert sorted(seen) == list(range(24))
    assert plan.epoch(2) == 1.0


def test_a_step_always_gets_the_same_rows_and_epochs_reshuffle():
    plan = BatchPlan(num_rows=10, batch_size=5, grad_accum=1, world=1, seed=0)
    assert plan.rows(3, 0, 0) == BatchPlan(10, 5, 1, 1, 0).rows(3, 0, 0)
    first_epoch = plan.rows(0, 0, 0) + plan.rows(1, 0, 0)
    second_epoch = plan.rows(2, 0, 0) + plan.rows(3, 0, 0)
    assert sorted(first_epoch) == sorted(second_epoch) == list(range(10))
    assert first_epoch != second_epoch


def test_pad_rows_right_pads_and_masks():
    batch = pad_rows(
        [{"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]}, {"input_ids": [8], "loss_mask": [1]}], 0
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]
    assert batch["input_ids"].dtype == torch.long


def test_grouping_by_length_keeps_every_row_once_per_epoch_and_cuts_padding():
    generator = torch.Generator().manual_seed(0)
    lengths = tuple(torch.randint(20, 1024, (200,), generator=generator).tolist())
    grouped = BatchPlan(num_rows=200, batch_size=4, grad_accum=1, world=2, seed=1, lengths=lengths)
    plain = BatchPlan(num_rows=200, batch_size=4, grad_accum=1, world=2, seed=1)

    def epoch(plan):
        return [plan.rows(step, 0, rank) for step in range(25) for rank in range(2)]

    assert sorted(r for batch in epoch(grouped) for r in batch) == list(range(200))
    assert epoch(grouped) == epoch(BatchPlan(200, 4, 1, 2, 1, lengths))  # resumable: a step's rows are fixed

    def padded(plan) -> float:
        return sum(max(lengths[r] for r in b) * len(b) for b in epoch(plan)) / sum(lengths)

    assert padded(grouped) < 1.1 < 1.3 < padded(plain)
    # The next epoch regroups: rows meet other rows.
    second = [grouped.rows(step, 0, rank) for step in range(25, 50) for rank in range(2)]
    assert sorted(map(sorted, second)) != sorted(map(sorted, epoch(grouped)))
