"""Torch reference of KV-cache compaction: after verification, move each request's accepted
tree path from its tree slots to the sequence slots that follow the committed prefix.

For request b and slot i < path_lengths[b]:
    cache[b, :, dst_starts[b] + i] <- cache[b, :, src_positions[b, i]]   (the values before the call)
in every cache of the list (the k and v of every layer). `heads/kv_cache.py`'s `KVCache.compact`
is the one-request, one-layer case. Sources may overlap destinations: each cache is read whole
before it is written. It lives apart from the kernel so it imports without Triton.
"""

from collections.abc import Sequence

import torch


def check_compact_args(
    caches: Sequence[torch.Tensor],
    src_positions: torch.Tensor,
    path_lengths: torch.Tensor,
    dst_starts: torch.Tensor,
) -> None:
    """Shape, dtype and device checks shared by the reference and the kernel (no host sync)."""
    if len(caches) == 0:
        raise ValueError("compact_kv: caches is empty")
    first = caches[0]
    if first.dim() != 4:
        raise ValueError(
            f"compact_kv: caches must be [B, kv_heads, max_len, head_dim], got {tuple(first.shape)}"
        )
    for index, cache in enumerate(caches):
        if (cache.shape, cache.dtype, cache.device, cache.stride()) != (
            first.shape,
            first.dtype,
            first.device,
            first.stride(),
        ):
            raise ValueError(
                f"compact_kv: caches[{index}] is {tuple(cache.shape)} {cache.dtype} on {cache.device} "
                f"(strides {cache.stride()}); caches[0] is {tuple(first.shape)} {first.dtype} on "
                f"{first.device} (strides {first.stride()}): one call moves same-layout caches"
            )
    if len({cache.data_ptr() for cache in caches}) != len(caches):
        raise ValueError("compact_kv: a cache appears twice in caches; each would be moved twice")
    batch = first.shape[0]
    if src_positions.dim() != 2 or src_positions.shape[0] != batch or src_positions.shape[1] < 1:
        raise ValueError(
            f"compact_kv: src_positions must be [B={batch}, P>=1], got {tuple(src_positions.shape)}"
        )
    for name, tensor in [("path_lengths", path_lengths), ("dst_starts", dst_starts)]:
        if tensor.shape != (batch,):
            raise ValueError(f"compact_kv: {name} must be [B={batch}], got {tuple(tensor.shape)}")
    for name, tensor in [
        ("src_positions", src_positions),
        ("path_lengths", path_lengths),
        ("dst_starts", dst_starts),
    ]:
        if tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
            raise ValueError(f"compact_kv: {name} must hold integers, got {tensor.dtype}")
        if tensor.device != first.device:
            raise ValueError(f"compact_kv: {name} is on {tensor.device}, the caches on {first.device}")


def compact_kv_reference(
    caches: Sequence[torch.Tensor],
    src_positions: torch.Tensor,
    path_lengths: torch.Tensor,
    dst_starts: torch.Tensor,
) -> None:
    """Move each request's accepted path into place, in every cache, in place.

    caches: k and v of every layer, each [B, kv_heads, max_len, head_dim], same layout;
    src_positions [B, P]: the path's cache positions, ascending (entries past path_lengths[b]
    are ignored); path_lengths [B] in 0..P; dst_starts [B]. Every position must lie in
    [0, max_len).
    """
    check_compact_args(caches, src_positions, path_lengths, dst_starts)
    batch, num_kv_heads, max_len, head_dim = caches[0].shape
    slots = torch.arange(src_positions.shape[1], device=src_positions.device)  # [P]
    keep = slots[None, :] < path_lengths[:, None]  # [B, P]
    # Slots past a path repeat its slot 0 (same source, destination and value), so the scatter
    # writes each position one value only; an empty path copies position 0 onto itself.
    slot = torch.where(keep, slots, 0)  # [B, P]
    empty = (path_lengths == 0)[:, None]  # [B, 1]
    dst = torch.where(empty, 0, dst_starts[:, None] + slot).long()  # [B, P]
    src = torch.where(empty, dst, src_positions.gather(1, slot)).long()  # [B, P]
    shape = (batch, num_kv_heads, src.shape[1], head_dim)
    src_index = src[:, None, :, None].expand(shape)
    dst_index = dst[:, None, :, None].expand(shape)
    for cache in caches:
        moved = cache.gather(2, src_index)  # [B, kv_heads, P, head_dim], a copy: all reads before any write
        cache.scatter_(2, dst_index, moved)
