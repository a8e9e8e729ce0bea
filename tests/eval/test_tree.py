import pytest
import torch

from eval.tree import (
    DEFAULT_MEDUSA_PATHS,
    causal_mask,
    chain_layout,
    prune_to_budget,
    select_children,
    static_tree,
    subtree_parents,
    tree_attention_mask,
    tree_layout,
)
from tests.eval.stats import chi_square, chi_square_critical

# root -> 1, 2; 1 -> 3, 4; 4 -> 5
PARENTS = torch.tensor([-1, 0, 0, 1, 1, 4])


def test_layout_depths_ancestors_and_children():
    layout = tree_layout(PARENTS, max_depth=3, max_children=2)
    assert layout.depths.tolist() == [0, 1, 1, 2, 2, 3]
    assert layout.ancestors[5].nonzero().flatten().tolist() == [0, 1, 4, 5]
    assert layout.ancestors[2].nonzero().flatten().tolist() == [0, 2]
    assert layout.children.tolist() == [[1, 2], [3, 4], [-1, -1], [-1, -1], [5, -1], [-1, -1]]


def test_chain_layout_is_a_single_path():
    layout = chain_layout(3)
    assert layout.depths.tolist() == [0, 1, 2, 3]
    assert layout.ancestors.tolist() == torch.ones(4, 4, dtype=torch.bool).tril().tolist()


def test_tree_mask_sees_prefix_ancestors_and_self_only():
    layout = tree_layout(PARENTS, max_depth=3, max_children=2)
    mask = tree_attention_mask(layout, prefix_len=4, kv_len=12)[0, 0]
    assert mask.shape == (6, 12)
    assert mask[:, :4].all() and not mask[:, 10:].any()
    assert mask[3, 4:10].nonzero().flatten().tolist() == [0, 1, 3]  # root, node 1, itself
    assert causal_mask(2, 3, 6, "cpu")[0, 0].long().tolist() == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
    ]


def test_pruning_keeps_ancestors_even_on_ties():
    # Candidates 1..5 (parents as PARENTS): node 4 and its child 5 tie with node 2.
    scores = torch.tensor([-1.0, -3.0, -2.0, -3.0, -3.0])
    keep = prune_to_budget(scores, budget=4) + 1
    assert keep.tolist() == [1, 2, 3, 4]  # 5 ties with 2 and 4 but comes after its parent
    assert subtree_parents(PARENTS, keep).tolist() == [-1, 0, 0, 1, 1]


def test_static_tree_orders_siblings_by_rank_and_rejects_gaps():
    tree = static_tree([(1,), (0,), (0, 0), (1, 0), (0, 1)])
    assert tree.parents == [-1, 0, 0, 1, 1, 2]
    assert tree.ranks == [0, 0, 1, 0, 1, 0]
    assert tree.depths == [0, 1, 1, 2, 2, 2]
    default = static_tree(DEFAULT_MEDUSA_PATHS)
    assert len(default.parents) == len(DEFAULT_MEDUSA_PATHS) + 1 and default.max_depth == 4
    with pytest.raises(ValueError, match="prefix \\(0, 0\\) is missing"):
        static_tree([(0,), (1,), (0, 0, 0)])
    with pytest.raises(ValueError, match="rank 1 under \\(0,\\) is missing"):
        static_tree([(0,), (0, 0), (0, 2)])


def test_greedy_children_are_the_top_k():
    log_probs = torch.tensor([[0.1, 0.5, 0.2, 0.2]]).log()
    tokens, scores = select_children(log_probs, 2, sampled=False)
    assert tokens.tolist() == [[1, 2]] or tokens.tolist() == [[1, 3]]
    torch.testing.assert_close(scores, log_probs.gather(1, tokens))


def test_sampled_children_are_draws_without_replacement_in_order():
    """P(first = a, second = b) = q(a) q(b) / (1 - q(a)): sequential sampling without replacement."""
    draft_probs = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1, 0.0])
    draws = 100_000
    generator = torch.Generator().manual_seed(0)
    tokens, _ = select_children(draft_probs.log().expand(draws, -1), 2, sampled=True, generator=generator)
    assert (tokens[:, 0] != tokens[:, 1]).all()
    exact = draft_probs.unsqueeze(1) * draft_probs.unsqueeze(0) / (1 - draft_probs.unsqueeze(1))
    exact.fill_diagonal_(0)
    statistic, dof = chi_square(tokens[:, 0] * 6 + tokens[:, 1], exact.flatten())
    assert statistic < chi_square_critical(dof)
