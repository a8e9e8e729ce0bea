"""KV-cache compaction in Triton: every layer's k and v, every request, one launch.
Same function and signature as `compact_kv_reference` (read its docstring for the semantics).

The caches stay separate tensors (one `KVCache` per layer): the kernel gets a table of their
base addresses and moves raw elements (an integer type of the element's width), so any dtype
moves bit for bit. One program per (cache, request, kv head) slice.

Why overlapping ranges are safe. Slot i moves s_i -> d + i, with the sources ascending and
s_0 >= d, hence s_i >= d + i. Copying slot by slot in ascending order is safe: when slot i
writes d + i, every source still unread is s_j (j > i) >= d + j > d + i. Copying all slots at
once, unordered, is NOT: slot i may overwrite d + i = s_j for a j < i not yet read (sources
[d + 1, d + 2]: slot 1 writes d + 1 = s_0). So each program reads all of its slice's slots
into registers, waits at a barrier, then writes; that is safe for any distinct destinations
(ascending sources included), and programs touch disjoint slices.
"""

from collections.abc import Sequence
from functools import lru_cache

import torch
import triton
import triton.language as tl

from kernels.kv_compact_reference import check_compact_args

_ELEMENT_TYPES = {1: tl.int8, 2: tl.int16, 4: tl.int32, 8: tl.int64}  # element width -> bit-moving type


@triton.jit
def _compact_kv_kernel(
    cache_pointers,
    src_positions,
    path_lengths,
    dst_starts,
    max_len,
    head_dim,
    stride_batch,
    stride_head,
    stride_pos,
    stride_dim,
    stride_src,
    ELEMENT: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    cache_index = tl.program_id(0)
    request = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2).to(tl.int64)
    base = tl.load(cache_pointers + cache_index).to(tl.pointer_type(ELEMENT))
    base += request * stride_batch + head * stride_head
    slots = tl.arange(0, BLOCK_P)
    in_path = slots < tl.load(path_lengths + request)
    src = tl.load(src_positions + request * stride_src + slots, mask=in_path, other=0).to(tl.int64)
    dst = tl.load(dst_starts + request).to(tl.int64) + slots
    # Out-of-range positions are skipped: a bad index must never write outside the cache.
    keep = in_path & (src >= 0) & (src < max_len) & (dst >= 0) & (dst < max_len)
    dims = tl.arange(0, BLOCK_D)
    mask = keep[:, None] & (dims < head_dim)[None, :]
    cols = dims.to(tl.int64)[None, :] * stride_dim
    values = tl.load(base + src[:, None] * stride_pos + cols, mask=mask)
    tl.debug_barrier()  # every read of this slice lands before any write (see the module docstring)
    tl.store(base + dst[:, None] * stride_pos + cols, values, mask=mask)


@lru_cache(maxsize=16)
def _pointer_table(pointers: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The caches' base addresses on the device, built once: caches are allocated once and reused."""
    return torch.tensor(pointers, dtype=torch.int64, device=device)


def compact_kv_triton(
    caches: Sequence[torch.Tensor],
    src_positions: torch.Tensor,
    path_lengths: torch.Tensor,
    dst_starts: torch.Tensor,
) -> None:
    """Move each request's accepted path into place, in every cache, in place, in one launch.

    caches: k and v of every layer, each [B, kv_heads, max_len, head_dim], same layout;
    src_positions [B, P] ascending per request (entries past path_lengths[b] are ignored);
    path_lengths [B] in 0..P; dst_starts [B]. CUDA tensors, or CPU under TRITON_INTERPRET=1.
    """
    check_compact_args(caches, src_positions, path_lengths, dst_starts)
    first = caches[0]
    batch, num_kv_heads, max_len, head_dim = first.shape
    if first.element_size() not in _ELEMENT_TYPES:
        raise ValueError(f"compact_kv: caches of {first.dtype} ({first.element_size()} bytes) unsupported")
    if batch == 0 or num_kv_heads == 0:
        return
    src_positions = src_positions.contiguous()
    _compact_kv_kernel[(len(caches), batch, num_kv_heads)](
        _pointer_table(tuple(cache.data_ptr() for cache in caches), first.device),
        src_positions,
        path_lengths,
        dst_starts,
        max_len,
        head_dim,
        *first.stride(),
        src_positions.stride(0),
        ELEMENT=_ELEMENT_TYPES[first.element_size()],
        BLOCK_P=triton.next_power_of_2(src_positions.shape[1]),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
