"""Tree attention metadata: the reference against hand-checked trees and eval's layout, the
kernel (under the Triton interpreter) against the reference on random batched trees."""

import pytest
import torch

from tests.kernels.triton_required import import_triton

import_triton()

from kernels.tree_metadata import tree_metadata_triton  # noqa: E402
from kernels.tree_metadata_reference import tree_metadata_reference  # noqa: E402
from tests.kernels.allocations import TrackAllocations  # noqa: E402
from tests.kernels.trees import random_trees  # noqa: E402

# root -> 1, 2; 1 -> 3, 4; 4 -> 5; then node 6 is padding
PARENTS = torch.tensor([[-1, 0, 0, 1, 1, 4, -1]])


def test_reference_on_a_hand_checked_tree():
    meta = tree_metadata_reference(PARENTS, torch.tensor([4]), kv_len=13, max_depth=3, max_children=2)
    assert meta.positions.tolist() == [[4, 5, 5, 6, 6, 7, 4]]
    assert meta.children.tolist() == [[[1, 2], [3, 4], [-1, -1], [-1, -1], [5, -1], [-1, -1], [-1, -1]]]
    mask = meta.attn_mask[0, 0]
    assert mask.shape == (7, 13)
    assert mask[:, :4].all() and not mask[:, 11:].any()
    tree_part = [row.nonzero().flatten().tolist() for row in mask[:, 4:11]]
    assert tree_part == [[0], [0, 1], [0, 2], [0, 1, 3], [0, 1, 4], [0, 1, 4, 5], [6]]  # padding: itself


def test_bounds_cut_the_climb_the_children_and_the_mask():
    """max_depth 2 stops node 5's climb below the root; max_children 1 lists first children only;
    kv_len 8 cuts the mask inside the tree."""
    meta = tree_metadata_reference(PARENTS, torch.tensor([4]), kv_len=8, max_depth=2, max_children=1)
    assert meta.positions[0, 5] == 4 + 2
    assert meta.children[0, :, 0].tolist() == [1, 3, -1, -1, 5, -1, -1]
    assert meta.attn_mask.shape == (1, 1, 7, 8)
    assert meta.attn_mask[0, 0, 5].nonzero().flatten().tolist() == [0, 1, 2, 3, 5]  # prefix, node 1


def _assert_kernel_matches(parents, prefix_lens, kv_len, max_depth, max_children):
    expected = tree_metadata_reference(parents, prefix_lens, kv_len, max_depth, max_children)
    with TrackAllocations(poison=True) as track:
        actual = tree_metadata_triton(parents, prefix_lens, kv_len, max_depth, max_children)
    assert track.poisoned == sum(t.numel() > 0 for t in expected)  # every output starts as garbage
    for name, got, want in zip(expected._fields, actual, expected):
        assert got.dtype == want.dtype and torch.equal(got, want), name


@pytest.mark.parametrize(
    "batch, num_nodes, depth, padding",
    [(1, 2, 1, 0), (1, 9, 8, 0), (2, 7, 3, 2), (5, 17, 4, 0), (3, 33, 6, 5), (2, 61, 5, 0)],
)
def test_kernel_matches_the_reference_on_random_trees(batch, num_nodes, depth, padding):
    generator = torch.Generator().manual_seed(batch * 100 + num_nodes)
    parents, most_children = random_trees(batch, num_nodes, depth, generator, padding)
    prefix_lens = torch.randint(0, 40, (batch,), generator=generator)
    kv_len = 40 + num_nodes + 3  # some slots after every tree
    _assert_kernel_matches(parents, prefix_lens, kv_len, depth, most_children)
    # Tighter bounds than the trees need: the climb, the lists and the mask are cut the same way.
    _assert_kernel_matches(
        parents, prefix_lens, kv_len=37, max_depth=depth - 1, max_children=most_children - 1
    )


def test_a_lone_root_and_int32_inputs():
    _assert_kernel_matches(torch.tensor([[-1], [-1]], dtype=torch.int32), torch.tensor([0, 3]), 5, 1, 1)


def test_eval_layout_matches_the_old_formulas():
    """eval.tree's layout (built on the op) equals the previous torch formulas on a valid tree."""
    from eval.tree import tree_attention_mask, tree_layout

    parents = PARENTS[0, :6]
    layout = tree_layout(parents, max_depth=3, max_children=2)
    assert layout.depths.tolist() == [0, 1, 1, 2, 2, 3]
    expected = torch.eye(6, dtype=torch.bool)
    for node, parent in enumerate(parents.tolist()):
        if parent >= 0:
            expected[node] |= expected[parent]
    assert torch.equal(layout.ancestors, expected)
    mask = tree_attention_mask(layout, prefix_len=4, kv_len=12)
    assert torch.equal(mask[0, 0, :, 4:10], expected) and mask[0, 0, :, :4].all() and not mask[..., 10:].any()


def test_bad_arguments_raise_a_clear_error():
    with pytest.raises(ValueError, match="parents must be integer"):
        tree_metadata_triton(PARENTS.float(), torch.tensor([0]), 8, 3, 2)
    with pytest.raises(ValueError, match="prefix_lens must be integer"):
        tree_metadata_reference(PARENTS, torch.tensor([0, 1]), 8, 3, 2)
    with pytest.raises(ValueError, match="max_depth=-1"):
        tree_metadata_triton(PARENTS, torch.tensor([0]), 8, -1, 2)
