"""Deterministic batching: step s always gets the same rows, so resume needs only s.

Rows are shuffled once per epoch with (seed, epoch) and dealt out in order: micro-batch m
of optimizer step s on rank r takes the next `batch_size` rows at position
((s * grad_accum + m) * world + r) * batch_size of the endless shuffled stream. The data
position of a run is therefore fully described by its optimizer step.

With row lengths given (train.group_by_length), each epoch's shuffled order is regrouped in
chunks of GROUP_BATCHES micro-batches: a chunk is sorted by length and cut into micro-batches,
whose order inside the chunk is shuffled again. A micro-batch then holds rows of about one
length, so padding to its longest row costs ~3% instead of ~25% (conversations of 50 to 1024
tokens), while which rows meet in a chunk stays random (HF Trainer's group_by_length).
"""

from dataclasses import dataclass
from functools import lru_cache

import torch

GROUP_BATCHES = 16


@dataclass(frozen=True)
class BatchPlan:
    num_rows: int
    batch_size: int
    grad_accum: int
    world: int
    seed: int
    lengths: tuple[int, ...] = ()  # every row's length: micro-batches grouped by length; () = not

    @classmethod
    def for_rows(cls, rows, cfg, world: int) -> "BatchPlan":
        """The plan a training job (TrainConfig `cfg`) follows over `rows` on `world` ranks."""
        lengths = tuple(len(ids) for ids in rows["input_ids"]) if cfg.group_by_length else ()
        return cls(len(rows), cfg.batch_size, cfg.grad_accum, world, cfg.seed, lengths)

    def rows(self, step: int, micro: int, rank: int) -> list[int]:
        first = ((step * self.grad_accum + micro) * self.world + rank) * self.batch_size
        rows = []
        for position in range(first, first + self.batch_size):
            epoch, offset = divmod(position, self.num_rows)
            rows.append(_epoch_order(self.seed, epoch, self.num_rows, self.lengths, self.batch_size)[offset])
        return rows

    def epoch(self, step: int) -> float:
        return step * self.grad_accum * self.world * self.batch_size / self.num_rows


@lru_cache(maxsize=2)
def _epoch_order(
    seed: int, epoch: int, num_rows: int, lengths: tuple[int, ...], batch_size: int
) -> list[int]:
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    order = torch.randperm(num_rows, generator=generator).tolist()
    if not lengths:
        return order
    grouped = []
    group = GROUP_BATCHES * batch_size
    for first in range(0, num_rows, group):
        chunk = sorted(order[first : first + group], key=lambda row: lengths[row])
        batches = [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
        full = len(chunk) // batch_size  # a last, partial micro-batch stays last
        for k in [*torch.randperm(full, generator=generator).tolist(), *range(full, len(batches))]:
            grouped.extend(batches[k])
    return grouped


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
