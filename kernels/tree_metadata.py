"""Tree attention metadata in Triton: positions, attention mask and children lists of a batch of
draft trees in one launch. Same function and signature as `tree_metadata_reference` (read its
docstring for the semantics).

One program per (request, block of nodes). Each program climbs its nodes' ancestor chains
(max_depth loads of the parent row, which stays in cache) for the depths, sweeps the mask row
in column tiles deciding each slot as prefix / ancestor-or-self / neither, and lists each of its
nodes' children by a prefix count over the parent row. Every output element is written by
exactly one program, once.
"""

import torch
import triton
import triton.language as tl

from kernels.tree_metadata_reference import TreeMetadata, check_metadata_args

MASK_COLUMNS = 256  # mask slots per tile
TILE_ELEMENTS = 4096  # nodes x parent-row entries per program (bounds the registers)


@triton.jit
def _climb(parent_row, hop, num_nodes):
    """One step up from each hop [BLOCK_I]; roots, padding and out-of-range parents stay put."""
    up = tl.load(parent_row + hop, mask=(hop >= 0) & (hop < num_nodes), other=-1).to(tl.int64)
    return tl.where((up >= 0) & (up < num_nodes), up, hop)


@triton.jit
def _tree_metadata_kernel(
    parents,
    prefix_lens,
    positions,
    attn_mask,
    children,
    num_nodes,
    kv_len,
    max_depth,
    max_children,
    stride_parents,
    stride_positions,
    stride_mask_batch,
    stride_mask_node,
    stride_children_batch,
    stride_children_node,
    BLOCK_I: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    request = tl.program_id(0).to(tl.int64)
    nodes = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I).to(tl.int64)  # the nodes this program owns
    owned = nodes < num_nodes
    parent_row = parents + request * stride_parents
    prefix = tl.load(prefix_lens + request).to(tl.int64)

    depth = tl.zeros((BLOCK_I,), tl.int64)
    hop = nodes
    for _ in range(max_depth):
        up = _climb(parent_row, hop, num_nodes)
        depth += (up != hop).to(tl.int64)
        hop = up
    tl.store(positions + request * stride_positions + nodes, prefix + depth, mask=owned)

    mask_rows = attn_mask + request * stride_mask_batch + nodes[:, None] * stride_mask_node
    for start in range(0, kv_len, BLOCK_L):
        columns = start + tl.arange(0, BLOCK_L).to(tl.int64)
        tree_column = (columns - prefix)[None, :]  # [1, BLOCK_L] node written at each slot
        sees = tree_column == nodes[:, None]  # itself
        hop = nodes
        for _ in range(max_depth):
            hop = _climb(parent_row, hop, num_nodes)
            sees |= tree_column == hop[:, None]
        visible = (tree_column < 0) | sees
        tl.store(mask_rows + columns[None, :], visible, mask=owned[:, None] & (columns < kv_len)[None, :])

    others = tl.arange(0, BLOCK_N).to(tl.int64)
    other_parents = tl.load(parent_row + others, mask=others < num_nodes, other=-1).to(tl.int64)
    is_child = other_parents[None, :] == nodes[:, None]  # [BLOCK_I, BLOCK_N]
    rank = tl.cumsum(is_child.to(tl.int32), axis=1)  # 1-based sibling rank at each child
    slots = tl.arange(0, BLOCK_C)[None, :]
    listed = tl.full((BLOCK_I, BLOCK_C), -1, tl.int64)
    for slot in range(max_children):
        child = tl.max(tl.where(is_child & (rank == slot + 1), others[None, :], -1), axis=1)
        listed = tl.where(slots == slot, child[:, None], listed)
    child_rows = children + request * stride_children_batch + nodes[:, None] * stride_children_node
    tl.store(child_rows + slots, listed, mask=owned[:, None] & (slots < max_children))


def tree_metadata_triton(
    parents: torch.Tensor,
    prefix_lens: torch.Tensor,
    kv_len: int,
    max_depth: int,
    max_children: int,
) -> TreeMetadata:
    """parents [B, N], prefix_lens [B], kv_len mask columns -> TreeMetadata (positions [B, N],
    attn_mask [B, 1, N, kv_len], children [B, N, max_children]), in one launch. CUDA tensors, or
    CPU under TRITON_INTERPRET=1."""
    check_metadata_args(parents, prefix_lens, kv_len, max_depth, max_children)
    batch, num_nodes = parents.shape
    device = parents.device
    positions = torch.empty(batch, num_nodes, dtype=torch.long, device=device)
    attn_mask = torch.empty(batch, 1, num_nodes, kv_len, dtype=torch.bool, device=device)
    children = torch.empty(batch, num_nodes, max_children, dtype=torch.long, device=device)
    if batch == 0:
        return TreeMetadata(positions, attn_mask, children)
    parents, prefix_lens = parents.contiguous(), prefix_lens.contiguous()
    block_n = triton.next_power_of_2(num_nodes)
    block_i = max(1, min(16, TILE_ELEMENTS // block_n))
    _tree_metadata_kernel[(batch, triton.cdiv(num_nodes, block_i))](
        parents,
        prefix_lens,
        positions,
        attn_mask,
        children,
        num_nodes,
        kv_len,
        max_depth,
        max_children,
        parents.stride(0),
        positions.stride(0),
        attn_mask.stride(0),
        attn_mask.stride(2),
        children.stride(0),
        children.stride(1),
        BLOCK_I=block_i,
        BLOCK_N=block_n,
        BLOCK_L=min(MASK_COLUMNS, triton.next_power_of_2(max(kv_len, 1))),
        BLOCK_C=triton.next_power_of_2(max(max_children, 1)),
    )
    return TreeMetadata(positions, attn_mask, children)
