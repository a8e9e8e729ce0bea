"""Deterministic batching: step s always gets the same rows, so resume needs only s.

Rows are shuffled once per epoch with (seed, epoch) and dealt out in order: micro-batch m
of optimizer step s on rank r takes the next `batch_size` rows at position
((s * grad_accum + m) * world + r) * batch_size of the endless shuffled stream. The data
position of a run is therefore fully described by its optimizer step.
"""

from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class BatchPlan:
    num_rows: int
    batch_size: int
    grad_accum: int
    world: int
    seed: int

    def rows(self, step: int, micro: int, rank: int) -> list[int]:
        first = ((step * self.grad_accum + micro) * self.world + rank) * self.batch_size
        rows = []
        for position in range(first, first + self.batch_size):
            epoch, offset = divmod(position, self.num_rows)
            rows.append(_epoch_order(self.seed, epoch, self.num_rows)[offset])
        return rows

    def epoch(self, step: int) -> float:
        return step * self.grad_accum * self.world * self.batch_size / self.num_rows


@lru_cache(maxsize=2)
def _epoch_order(seed: int, epoch: int, num_rows: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(num_rows, generator=generator).tolist()


def pad_rows(rows: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad rows {input_ids, loss_mask} into [B, T] tensors plus attention_mask."""
    length = max(len(r["input_ids"]) for r in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(rows), length), dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        input_ids[i, :n] = torch.as_tensor(row["input_ids"])
        loss_mask[i, :n] = torch.as_tensor(row["loss_mask"])
        attention_mask[i, :n] = 1
    return {"input_ids": input_ids, "loss_mask": loss_mask, "attention_mask": attention_mask}
