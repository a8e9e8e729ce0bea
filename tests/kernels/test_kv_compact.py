"""KV-cache compaction: the reference against `KVCache.compact`, the kernel (under the Triton
interpreter) against the reference, overlapping ranges, and untouched regions left alone."""

import pytest
import torch

from tests.kernels.triton_required import import_triton

import_triton()

from heads.kv_cache import KVCache  # noqa: E402
from kernels.kv_compact import compact_kv_triton  # noqa: E402
from kernels.kv_compact_reference import compact_kv_reference  # noqa: E402

NUM_LAYERS, KV_HEADS, MAX_LEN, HEAD_DIM = 2, 2, 24, 6  # head_dim 6: a partial column block
POISON_FROM = 20  # positions >= this are never sources or destinations: NaN must stay put


def _caches(batch, dtype=torch.float32, seed=0):
    """k and v of every layer; distinct values everywhere, NaN in the never-used tail."""
    generator = torch.Generator().manual_seed(seed)
    caches = []
    for _ in range(2 * NUM_LAYERS):
        cache = torch.randn(batch, KV_HEADS, MAX_LEN, HEAD_DIM, generator=generator).to(dtype)
        cache[:, :, POISON_FROM:] = float("nan")
        caches.append(cache)
    return caches


def _path(length, generator, max_pos=POISON_FROM):
    """A destination start and `length` ascending sources at or after it (they overlap often)."""
    dst_start = int(torch.randint(0, max_pos - length - 6, (1,), generator=generator))
    candidates = torch.arange(dst_start, min(dst_start + length + 6, max_pos))
    src = candidates[torch.randperm(len(candidates), generator=generator)[:length]].sort().values
    return dst_start, src


def _requests(lengths, seed):
    """src_positions [B, P] padded with -1 past each path, path_lengths [B], dst_starts [B]."""
    generator = torch.Generator().manual_seed(seed)
    width = max(max(lengths), 1)
    src_positions = torch.full((len(lengths), width), -1, dtype=torch.int64)
    dst_starts = torch.empty(len(lengths), dtype=torch.int64)
    for b, length in enumerate(lengths):
        dst_starts[b], src = _path(length, generator)
        src_positions[b, :length] = src
    return src_positions, torch.tensor(lengths), dst_starts


def _assert_same(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def test_reference_matches_kv_cache_compact_on_one_request():
    generator = torch.Generator().manual_seed(0)
    for length in range(1, 9):
        layer = KVCache(1, KV_HEADS, MAX_LEN, HEAD_DIM)
        layer.k.copy_(torch.randn(layer.k.shape, generator=generator))
        layer.v.copy_(torch.randn(layer.v.shape, generator=generator))
        caches = [layer.k.clone(), layer.v.clone()]
        dst_start, src = _path(length, generator)
        layer.compact(src, dst_start)
        compact_kv_reference(caches, src[None], torch.tensor([length]), torch.tensor([dst_start]))
        _assert_same(caches[0], layer.k)
        _assert_same(caches[1], layer.v)


@pytest.mark.parametrize(
    "lengths",
    [[1], [2], [3], [4], [5], [6], [7], [8], [8, 1, 5], [3, 0, 7, 2]],
    ids=lambda lengths: "paths" + "-".join(map(str, lengths)),
)
def test_kernel_matches_the_reference_and_leaves_the_rest_alone(lengths):
    src_positions, path_lengths, dst_starts = _requests(lengths, seed=sum(lengths) + len(lengths))
    before = _caches(len(lengths))
    expected = [cache.clone() for cache in before]
    compact_kv_reference(expected, src_positions, path_lengths, dst_starts)
    caches = [cache.clone() for cache in before]
    compact_kv_triton(caches, src_positions, path_lengths, dst_starts)

    for cache, reference, original in zip(caches, expected, before):
        _assert_same(cache, reference)
        for b, (length, dst_start) in enumerate(zip(lengths, dst_starts.tolist())):
            written = torch.zeros(MAX_LEN, dtype=torch.bool)
            written[dst_start : dst_start + length] = True
            _assert_same(cache[b][:, ~written], original[b][:, ~written])  # outside the destination
            moved = original[b][:, src_positions[b, :length]]
            _assert_same(cache[b][:, written], moved)  # the path's values, read before any write


@pytest.mark.parametrize("src", [[5, 6, 7, 8], [6, 7, 8, 9], [5, 7, 8, 12], [9, 10, 11, 12]])
def test_overlapping_ranges_move_the_original_values(src):
    """Destination 5..8; sources equal to it, shifted by one, partly overlapping, disjoint."""
    before = _caches(1, seed=len(src) + src[0])
    caches = [cache.clone() for cache in before]
    args = (torch.tensor([src]), torch.tensor([len(src)]), torch.tensor([5]))
    compact_kv_triton(caches, *args)
    for cache, original in zip(caches, before):
        _assert_same(cache[:, :, 5:9], original[:, :, src])
        _assert_same(cache[:, :, :5], original[:, :, :5])
        _assert_same(cache[:, :, 9:], original[:, :, 9:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int8])
def test_any_element_width_moves_bit_for_bit(dtype):
    src_positions, path_lengths, dst_starts = _requests([4, 6], seed=9)
    generator = torch.Generator().manual_seed(1)
    before = [
        torch.randint(-100, 100, (2, KV_HEADS, MAX_LEN, HEAD_DIM), generator=generator).to(dtype)
        for _ in range(2 * NUM_LAYERS)
    ]
    expected = [cache.clone() for cache in before]
    compact_kv_reference(expected, src_positions, path_lengths, dst_starts)
    caches = [cache.clone() for cache in before]
    compact_kv_triton(caches, src_positions, path_lengths, dst_starts)
    for cache, reference, original in zip(caches, expected, before):
        assert not torch.equal(reference, original)
        assert torch.equal(cache, reference)


def test_bad_arguments_raise_a_clear_error():
    caches = _caches(2)
    src_positions, path_lengths, dst_starts = _requests([2, 3], seed=0)
    with pytest.raises(ValueError, match=r"caches\[1\]"):
        compact_kv_triton([caches[0], caches[1][:1]], src_positions, path_lengths, dst_starts)
    with pytest.raises(ValueError, match="twice"):
        compact_kv_reference([caches[0], caches[0]], src_positions, path_lengths, dst_starts)
    with pytest.raises(ValueError, match="src_positions"):
        compact_kv_reference(caches, src_positions[:1], path_lengths, dst_starts)
    with pytest.raises(ValueError, match="dst_starts"):
        compact_kv_triton(caches, src_positions, path_lengths, dst_starts.float())
