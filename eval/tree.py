"""Draft trees: layout, attention metadata, and the node selection rules.

A tree is a parent array over N nodes in topological order: node 0 is the root (the
last committed token, whose target KV is not cached yet), parents[0] = -1 and
parents[i] < i for the others. Siblings are listed in the order verification tries them.
A node at depth d holds the token for the sequence position right after its parent's,
so its RoPE position is (root position + d), and it attends to the committed prefix,
its ancestors and itself. Depths, ancestors, children and masks come from the "tree_metadata"
kernel op (kernels/registry.py: Triton on CUDA, the torch reference elsewhere).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.registry import kernel
from kernels.tree_verify_reference import exponentials


@dataclass(frozen=True)
class TreeLayout:
    parents: torch.Tensor  # [N] long, -1 for the root
    depths: torch.Tensor  # [N] long, 0 for the root
    ancestors: torch.Tensor  # [N, N] bool, [i, j] = j is i or an ancestor of i
    children: torch.Tensor  # [N, C] long, each node's children in sibling order, -1 padded
    max_depth: int  # host-side bounds, so the verification loops never read the device
    max_children: int

    @property
    def num_nodes(self) -> int:
        return self.parents.numel()


def tree_layout(parents: torch.Tensor, max_depth: int, max_children: int) -> TreeLayout:
    """Depths, ancestor matrix and children lists from parents [N], without a host sync.

    max_depth / max_children are upper bounds the caller knows (the drafting depth and
    top-k): the tree must not exceed them.
    """
    num_nodes = parents.numel()
    prefix = torch.zeros(1, dtype=torch.long, device=parents.device)
    # With no prefix and N mask columns, the attention mask is the ancestor matrix.
    metadata = kernel("tree_metadata", parents.device)
    tables = metadata(parents.unsqueeze(0), prefix, num_nodes, max_depth, max_children)
    return TreeLayout(
        parents, tables.positions[0], tables.attn_mask[0, 0], tables.children[0], max_depth, max_children
    )


def chain_layout(length: int, device: torch.device | str = "cpu") -> TreeLayout:
    """A chain of `length` drafts as a tree (root + one child per level)."""
    parents = torch.arange(-1, length, device=device)
    return tree_layout(parents, max_depth=length, max_children=1)


def causal_mask(start: int, length: int, kv_len: int, device: torch.device | str) -> torch.Tensor:
    """[1, 1, length, kv_len] bool: the query at cache slot start + j sees slots 0 .. start + j."""
    query_slots = torch.arange(start, start + length, device=device).unsqueeze(1)
    return (torch.arange(kv_len, device=device).unsqueeze(0) <= query_slots).view(1, 1, length, kv_len)


def tree_attention_mask(layout: TreeLayout, prefix_len: int, kv_len: int) -> torch.Tensor:
    """[1, 1, N, kv_len] bool for a tree written at slots prefix_len ..: prefix + ancestors + self."""
    parents = layout.parents.unsqueeze(0)
    prefix = torch.full((1,), prefix_len, dtype=torch.long, device=parents.device)
    metadata = kernel("tree_metadata", parents.device)
    return metadata(parents, prefix, kv_len, layout.max_depth, layout.max_children).attn_mask


def select_children(
    log_probs: torch.Tensor, k: int, sampled: bool, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """k distinct children per row of log_probs [n, V] -> (tokens [n, k], their log-probs [n, k]).

    Greedy: the top-k. Sampling: k draws WITHOUT replacement, in draw order (Gumbel-top-k),
    which is what recursive rejection sampling needs to stay exact. Rows with fewer than k
    possible tokens yield children of log-prob -inf; verification skips them.
    """
    keys = log_probs
    if sampled:
        keys = log_probs - exponentials(log_probs, generator).log()  # log q + Gumbel noise
    tokens = keys.topk(k, dim=-1).indices
    return tokens, log_probs.gather(-1, tokens)


def prune_to_budget(scores: torch.Tensor, budget: int) -> torch.Tensor:
    """Indices (ascending) of the `budget` best nodes by cumulative log-prob scores [M] (EAGLE-2).

    A child never scores above its parent and comes after it, so a stable sort keeps the
    chosen set closed under ancestors, ties included.
    """
    order = scores.sort(descending=True, stable=True).indices
    return order[:budget].sort().values


def subtree_parents(parents: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Parents of the tree [root] + keep, renumbered; parents [M + 1] over root + candidates,
    keep [n] ascending candidate indices (>= 1) closed under ancestors -> [n + 1]."""
    renumber = torch.zeros_like(parents)
    renumber[keep] = torch.arange(1, keep.numel() + 1, device=parents.device)
    root = torch.full((1,), -1, dtype=parents.dtype, device=parents.device)
    return torch.cat([root, renumber[parents[keep]]])


@dataclass(frozen=True)
class StaticTree:
    """A fixed candidate tree (Medusa): node i takes candidate ranks[i] at its depth."""

    parents: list[int]  # root first, -1
    depths: list[int]
    ranks: list[int]  # rank of the node's token among its depth's candidates (root: 0)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @property
    def max_children(self) -> int:
        return max(self.parents.count(node) for node in range(len(self.parents)))

    def layout(self, device: torch.device | str) -> TreeLayout:
        parents = torch.tensor(self.parents, dtype=torch.long, device=device)
        return tree_layout(parents, self.max_depth, self.max_children)


def static_tree(paths: Sequence[Sequence[int]]) -> StaticTree:
    """Tree from Medusa-style rank paths, e.g. [(0,), (1,), (0, 0)]: (0, 1) = the 2nd candidate
    under the 1st. Every prefix must be present and each node's children must be ranks
    0..m-1: verification tries them in that order, so a gap would break exactness."""
    unique = sorted({tuple(path) for path in paths}, key=lambda path: (len(path), path))
    if not unique or any(len(path) == 0 or min(path) < 0 for path in unique):
        raise ValueError(f"tree paths {list(paths)!r}: need non-empty paths of ranks >= 0")
    index = {(): 0}
    parents, depths, ranks = [-1], [0], [0]
    for path in unique:
        prefix, rank = path[:-1], path[-1]
        if prefix not in index:
            raise ValueError(f"tree path {path}: its prefix {prefix} is missing")
        if rank > 0 and prefix + (rank - 1,) not in index:
            raise ValueError(f"tree path {path}: rank {rank - 1} under {prefix} is missing")
        index[path] = len(parents)
        parents.append(index[prefix])
        depths.append(len(path))
        ranks.append(rank)
    return StaticTree(parents, depths, ranks)


# A 15-node tree for Medusa heads: wide near the root, where candidates are most uncertain.
DEFAULT_MEDUSA_PATHS = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
    (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
    (0, 0, 0, 0),
)  # fmt: skip
