"""Random draft trees for the tree kernel tests: parent arrays of an exact depth, batched."""

import torch


def random_parents(num_nodes: int, depth: int, generator: torch.Generator) -> torch.Tensor:
    """parents [N] of a tree exactly `depth` deep (N > depth): a chain at random indices holds
    the depth, every other node hangs under a random earlier node that is less than depth deep."""
    chain = torch.randperm(num_nodes - 1, generator=generator)[:depth].sort().values + 1
    parents = [-1] * num_nodes
    depths = [0] * num_nodes
    for above, node in zip([0, *chain.tolist()], chain.tolist()):
        parents[node] = above
    for node in range(1, num_nodes):
        if parents[node] < 0:
            candidates = [other for other in range(node) if depths[other] < depth]
            parents[node] = candidates[int(torch.randint(len(candidates), (1,), generator=generator))]
        depths[node] = depths[parents[node]] + 1
    return torch.tensor(parents)


def random_trees(batch: int, num_nodes: int, depth: int, generator: torch.Generator, padding: int = 0):
    """parents [B, N]; the last `padding` nodes of row 0 are padding (parent -1), a request with a
    smaller tree. Returns (parents, the largest number of children of any node)."""
    rows = [random_parents(num_nodes, depth, generator) for _ in range(batch)]
    if padding:
        kept = random_parents(num_nodes - padding, min(depth, num_nodes - padding - 1), generator)
        rows[0] = torch.cat([kept, torch.full((padding,), -1)])
    parents = torch.stack(rows)
    most_children = max(int(torch.bincount(row[row >= 0], minlength=1).max()) for row in parents)
    return parents, most_children
