"""A static key/value cache for one attention layer, written at explicit positions.

Allocated once for the longest sequence; rejecting draft tokens is just moving the
write position (nothing is copied back), and accepting a tree path moves the accepted
nodes' entries into place with one gather (`compact`). Used by the draft heads and by
the decoder's cached target forward alike.
"""

from typing import NamedTuple

import torch
from torch import nn


class KVCache(nn.Module):
    def __init__(
        self,
        batch_size: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        super().__init__()
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        # Non-persistent: a cache is scratch space, never part of a checkpoint.
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def update(
        self, cache_positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k/v at cache_positions (`write_kv`); return the whole cache."""
        return write_kv(self.k, self.v, cache_positions, k, v)

    def rows(self, start: int, stop: int) -> "KVCache":
        """A cache over rows start .. stop - 1 of this one, sharing its storage: a prefill of one
        row, or a step over the busy rows only, writes straight into the batch."""
        view = KVCache.__new__(KVCache)
        nn.Module.__init__(view)
        view.register_buffer("k", self.k[start:stop], persistent=False)
        view.register_buffer("v", self.v[start:stop], persistent=False)
        return view

    def copy_row(self, src: int, dst: int, length: int) -> None:
        """Row dst's slots 0 .. length - 1 become row src's."""
        self.k[dst, :, :length] = self.k[src, :, :length]
        self.v[dst, :, :length] = self.v[src, :, :length]

    def take_rows(self, rows: torch.Tensor, length: int) -> "KVCache":
        """A copy of the given rows' slots 0 .. length - 1 and one spare slot after them: a
        forward over rows that are scattered through the batch (`put_rows` writes it back)."""
        part = KVCache(len(rows), self.k.shape[1], length + 1, self.k.shape[3], self.k.dtype, self.k.device)
        part.k[:, :, :length] = self.k[rows, :, :length]
        part.v[:, :, :length] = self.v[rows, :, :length]
        return part

    def put_rows(self, rows: torch.Tensor, part: "KVCache") -> None:
        """The inverse of `take_rows`: the rows' slots come back from `part` (its spare slot not)."""
        length = part.max_len - 1
        self.k[rows, :, :length] = part.k[:, :, :length]
        self.v[rows, :, :length] = part.v[:, :, :length]

    def compact(self, src_positions: torch.Tensor, dst_start: int) -> None:
        """Move entries at src_positions [n] (ascending) to dst_start .. dst_start + n - 1."""
        n = src_positions.numel()
        dst = torch.arange(dst_start, dst_start + n, device=self.k.device)
        self.k.index_copy_(2, dst, self.k.index_select(2, src_positions))
        self.v.index_copy_(2, dst, self.v.index_select(2, src_positions))


def write_kv(
    keys: torch.Tensor, values: torch.Tensor, cache_positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write k/v [B, kv_heads, S, head_dim] into the cache tensors keys/values [B, kv_heads, L,
    head_dim] at cache_positions [S] (every row alike) or [B, S] (each row at its own slots, as
    batched generation needs); return keys, values. A function of tensors, so that a compiled
    forward takes any cache of the same shape without recompiling (heads/compiled.py)."""
    if cache_positions.dim() == 1:
        keys.index_copy_(2, cache_positions, k.to(keys.dtype))
        values.index_copy_(2, cache_positions, v.to(values.dtype))
    else:
        # Indexed assignment, not scatter_: torch's CPU scatter_ copies the whole cache in
        # bf16 (16 ms vs 0.014 ms for a 64-row layer here). Rows [B, 1] and slots [B, S]
        # index dims 0 and 2, so the values go in as [B, S, kv_heads, head_dim].
        rows = torch.arange(k.shape[0], device=k.device)[:, None]
        keys[rows, :, cache_positions] = k.transpose(1, 2).to(keys.dtype)
        values[rows, :, cache_positions] = v.transpose(1, 2).to(values.dtype)
    return keys, values


class KVTensors(NamedTuple):
    """A cache's k and v as plain tensors, updated as KVCache is: what a compiled forward builds
    from its tensor arguments (heads/compiled.py), so that it never reads a module's buffers."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def update(
        self, cache_positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return write_kv(self.k, self.v, cache_positions, k, v)
