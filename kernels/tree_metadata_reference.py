"""Torch reference of tree attention metadata: from parent arrays, each node's RoPE position,
its attention mask over the KV cache, and its children lists, batched over requests.

A tree is a parent array over N nodes in topological order: node 0 is the root,
parents[0] = -1 and 0 <= parents[i] < i for the others; a node i > 0 with parents[i] = -1
is padding (a request with fewer nodes than N): it is nobody's child, has depth 0 and sees
the prefix and itself. Written at cache slots prefix_len .. prefix_len + N - 1, node i sits
at RoPE position prefix_len + depth(i) and attends to the prefix, its ancestors and itself;
its children are listed in node order (the order verification tries them). Ancestors are
found by climbing max_depth steps, and at most max_children children are listed per node:
both are bounds the caller knows (drafting depth, top-k), which the tree must not exceed.

It lives apart from the kernel so it imports without Triton; eval/tree.py builds on it.
"""

from typing import NamedTuple

import torch


class TreeMetadata(NamedTuple):
    positions: torch.Tensor  # [B, N] long: prefix_len + depth (RoPE positions)
    attn_mask: torch.Tensor  # [B, 1, N, kv_len] bool over cache slots: prefix, ancestors and self
    children: torch.Tensor  # [B, N, max_children] long: children in sibling order, -1 padded


def check_metadata_args(
    parents: torch.Tensor, prefix_lens: torch.Tensor, kv_len: int, max_depth: int, max_children: int
) -> None:
    """Shape, dtype and device checks shared by the reference and the kernel (no host sync)."""
    if (
        parents.dim() != 2
        or parents.shape[1] < 1
        or parents.is_floating_point()
        or parents.dtype == torch.bool
    ):
        raise ValueError(
            f"tree_metadata: parents must be integer [B, N>=1], got {parents.dtype} {tuple(parents.shape)}"
        )
    batch = parents.shape[0]
    if prefix_lens.shape != (batch,) or prefix_lens.is_floating_point() or prefix_lens.dtype == torch.bool:
        raise ValueError(
            f"tree_metadata: prefix_lens must be integer [B={batch}], got {prefix_lens.dtype} "
            f"{tuple(prefix_lens.shape)}"
        )
    if prefix_lens.device != parents.device:
        raise ValueError(
            f"tree_metadata: prefix_lens is on {prefix_lens.device}, parents on {parents.device}"
        )
    for name, value in [("kv_len", kv_len), ("max_depth", max_depth), ("max_children", max_children)]:
        if value < 0:
            raise ValueError(f"tree_metadata: {name}={value} must be >= 0")


def tree_metadata_reference(
    parents: torch.Tensor,
    prefix_lens: torch.Tensor,
    kv_len: int,
    max_depth: int,
    max_children: int,
) -> TreeMetadata:
    """parents [B, N] (module docstring), prefix_lens [B] committed slots before each tree,
    kv_len: mask columns (cache slots 0 .. kv_len - 1) -> TreeMetadata."""
    check_metadata_args(parents, prefix_lens, kv_len, max_depth, max_children)
    batch, num_nodes = parents.shape
    device = parents.device
    parents = parents.long()
    nodes = torch.arange(num_nodes, device=device).expand(batch, num_nodes)  # [B, N]
    step_up = torch.where(parents >= 0, parents, nodes)  # roots and padding are their own parents
    ancestors = torch.eye(num_nodes, dtype=torch.bool, device=device).repeat(batch, 1, 1)  # [B, N, N]
    depths = torch.zeros_like(parents)
    hop = nodes
    for _ in range(max_depth):
        up = step_up.gather(1, hop)
        depths += (up != hop).long()
        hop = up
        ancestors.scatter_(2, hop.unsqueeze(2), True)

    same_parent = parents.unsqueeze(1) == parents.unsqueeze(2)  # [B, N, N]: [b, i, j] = i and j are siblings
    earlier = torch.ones(num_nodes, num_nodes, dtype=torch.bool, device=device).tril(-1)
    sibling_rank = (same_parent & earlier).long().sum(dim=-1)  # [B, N]
    listed = (parents >= 0) & (sibling_rank < max_children)
    # Unlisted nodes write their own index into a spare column that is cut off afterwards.
    children = torch.full((batch, num_nodes, max_children + 1), -1, dtype=torch.long, device=device)
    slot = torch.where(
        listed, parents * (max_children + 1) + sibling_rank, nodes * (max_children + 1) + max_children
    )
    children.view(batch, -1).scatter_(1, slot, torch.where(listed, nodes, -1))

    columns = torch.arange(kv_len, device=device)  # [L]
    tree_column = columns - prefix_lens.long().unsqueeze(1)  # [B, L]: node index at each slot
    in_tree = (tree_column >= 0) & (tree_column < num_nodes)
    sees_node = ancestors.gather(
        2, tree_column.clamp(0, num_nodes - 1).unsqueeze(1).expand(-1, num_nodes, -1)
    )
    attn_mask = (tree_column < 0).unsqueeze(1) | (in_tree.unsqueeze(1) & sees_node)  # [B, N, L]
    positions = prefix_lens.long().unsqueeze(1) + depths
    return TreeMetadata(positions, attn_mask.unsqueeze(1), children[:, :, :max_children])
