"""Tree verification: the reference against a plain per-request walk, the kernel (under the
Triton interpreter) against the reference with shared random numbers, and the kernel's sampled
continuations against the target's exact distribution (chi-square, stated power)."""

import pytest
import torch

from tests.kernels.triton_required import import_triton

triton = import_triton()

from eval.tree import select_children  # noqa: E402
from kernels.tree_metadata_reference import tree_metadata_reference  # noqa: E402
from kernels.tree_verify import MAX_TILE, SEARCH_DIGITS, VerifyBlocks, tree_verify_triton  # noqa: E402
from kernels.tree_verify_reference import (  # noqa: E402
    draw_uniforms,
    processed_probs,
    tree_verify_reference,
)
from tests.eval.stats import chi_square, chi_square_critical, power_against  # noqa: E402
from tests.kernels.allocations import TrackAllocations  # noqa: E402
from tests.kernels.trees import random_trees  # noqa: E402

DEFAULT_BLOCKS = VerifyBlocks()
SETTINGS = {  # (temperature, top_k, top_p)
    "greedy": (0.0, 0, 1.0),
    "T=1": (1.0, 0, 1.0),
    "T=0.7,top_k=5": (0.7, 5, 1.0),
    "T=1.2,top_p=0.8": (1.2, 0, 0.8),
    "T=0.9,top_k=8,top_p=0.7": (0.9, 8, 0.7),
}


def _children(parents, max_depth, max_children):
    zeros = torch.zeros(parents.shape[0], dtype=torch.long)
    return tree_metadata_reference(parents, zeros, parents.shape[1], max_depth, max_children).children


def _round_inputs(batch, num_nodes, vocab, depth, setting, seed, padding=0, dtype=torch.float32):
    """One verification round over random trees: (children, tokens, target_logits, draft_probs,
    uniforms, depth, *setting). Each node's children are draws without replacement from its
    draft distribution, which is the target's plus per-request noise (from close to unrelated)."""
    generator = torch.Generator().manual_seed(seed)
    temperature, top_k, top_p = setting
    parents, most_children = random_trees(batch, num_nodes, depth, generator, padding)
    children = _children(parents, depth, most_children)
    target_logits = (torch.randn(batch, num_nodes, vocab, generator=generator) * 2).to(dtype)
    noise = torch.linspace(0.2, 3.0, batch).view(batch, 1, 1) * torch.randn(
        target_logits.shape, generator=generator
    )
    draft_logits = target_logits.float() + noise
    draft_probs = processed_probs(draft_logits, temperature or 1.0, top_k, top_p)  # [B, N, V]
    tokens = torch.zeros(batch, num_nodes, dtype=torch.long)
    for b in range(batch):
        for node in range(num_nodes):
            kids = children[b, node][children[b, node] >= 0]
            if len(kids):
                draws, _ = select_children(draft_probs[b, node : node + 1].log(), len(kids), True, generator)
                tokens[b, kids] = draws[0]
    if temperature == 0:  # greedy: drafts from a close draft often are the target's argmax
        return children, tokens, target_logits, None, None, depth, *setting
    uniforms = draw_uniforms(batch, num_nodes, vocab, generator)
    return children, tokens, target_logits, draft_probs, uniforms, depth, *setting


def _kids(children_row, node):
    return [int(child) for child in children_row[node] if child >= 0]


def _greedy_walk(children, tokens, target_choice, max_depth):
    """The greedy rule for ONE request, written plainly: an independent check of the reference."""
    node, path = 0, []
    while len(path) < max_depth:
        matching = [child for child in _kids(children, node) if tokens[child] == target_choice[node]]
        if not matching:
            break
        node = matching[0]
        path.append(node)
    return path, int(target_choice[node])


def _sampling_walk(children, tokens, target_probs, draft_probs, uniforms, max_depth):
    """Recursive rejection sampling for ONE request, written plainly in float64."""
    node, path = 0, []
    target, draft = target_probs[0], draft_probs[0]
    while len(path) < max_depth:
        accepted = None
        for child in _kids(children, node):
            token = int(tokens[child])
            if draft[token] <= 0:
                continue
            if uniforms[child] * draft[token] < target[token]:
                accepted = child
                break
            residual = (target - draft).clamp_min(0)
            target = residual / residual.sum() if residual.sum() > 0 else target
            draft = draft.clone()
            draft[token] = 0
            draft = draft / draft.sum() if draft.sum() > 0 else draft
        if accepted is None:
            break
        node = accepted
        path.append(node)
        target, draft = target_probs[node], draft_probs[node]
    return path, int((target / -uniforms[len(tokens) :].log()).argmax())


@pytest.mark.parametrize("setting", SETTINGS)
def test_reference_matches_a_plain_walk(setting):
    inputs = _round_inputs(6, 13, 21, 4, SETTINGS[setting], seed=1)
    children, tokens, target_logits, draft_probs, uniforms, depth, temperature, top_k, top_p = inputs
    out = tree_verify_reference(*inputs)
    for b in range(6):
        if temperature == 0:
            path, next_token = _greedy_walk(children[b], tokens[b], target_logits[b].argmax(-1), depth)
        else:
            target_probs = processed_probs(target_logits[b], temperature, top_k, top_p).double()
            path, next_token = _sampling_walk(
                children[b], tokens[b], target_probs, draft_probs[b].double(), uniforms[b].double(), depth
            )
        assert out.path[b].tolist() == path + [-1] * (depth - len(path))
        assert out.accept_len[b] == len(path) and out.next_token[b] == next_token


def _assert_kernel_matches(inputs, blocks=DEFAULT_BLOCKS):
    expected = tree_verify_reference(*inputs)
    with TrackAllocations(poison=True) as track:
        actual = tree_verify_triton(*inputs, blocks=blocks)
    assert track.poisoned == 3  # accept lengths, next tokens and paths start as garbage
    for name, got, want in zip(expected._fields, actual, expected):
        assert torch.equal(got, want), name
    return expected


CASES = {  # batch, nodes, vocab, depth, padding
    "B1-N2-V37-D1": (1, 2, 37, 1, 0),
    "B1-N9-V100-D8": (1, 9, 100, 8, 0),
    "B5-N17-V129-D4-padded": (5, 17, 129, 4, 3),
    "B12-N40-V77-D6": (12, 40, 77, 6, 0),
}
# Greedy on every shape; each sampling setting on two (the interpreter is slow).
RUNS = [("greedy", case) for case in CASES] + [
    ("T=1", "B12-N40-V77-D6"),
    ("T=1", "B1-N9-V100-D8"),
    ("T=0.7,top_k=5", "B5-N17-V129-D4-padded"),
    ("T=0.7,top_k=5", "B1-N2-V37-D1"),
    ("T=1.2,top_p=0.8", "B5-N17-V129-D4-padded"),
    ("T=1.2,top_p=0.8", "B1-N2-V37-D1"),
    ("T=0.9,top_k=8,top_p=0.7", "B1-N9-V100-D8"),
    ("T=0.9,top_k=8,top_p=0.7", "B1-N2-V37-D1"),
]


@pytest.mark.parametrize("setting, case", RUNS, ids=[f"{setting}-{case}" for setting, case in RUNS])
def test_kernel_matches_the_reference(setting, case):
    batch, num_nodes, vocab, depth, padding = CASES[case]
    inputs = _round_inputs(batch, num_nodes, vocab, depth, SETTINGS[setting], sum(CASES[case]), padding)
    # Vocab tiles of 64: up to three per row, a partial one last; requests 8 to a program.
    expected = _assert_kernel_matches(inputs, VerifyBlocks(rows=8, vocab=64))
    assert expected.accept_len.max() <= depth


def test_acceptances_and_rejections_at_every_depth_are_covered():
    """The random rounds above are not all-accept or all-reject: over a batch, every depth up to
    the full one is reached and rounds stop at each of them."""
    inputs = _round_inputs(24, 11, 16, 4, SETTINGS["T=1"], seed=3)
    expected = _assert_kernel_matches(inputs)
    assert set(expected.accept_len.tolist()) == {0, 1, 2, 3, 4}


def test_bf16_logits_are_computed_in_fp32_and_ties_keep_the_lowest_id():
    """bf16 logits tie often at the top; both implementations pick the lowest id."""
    for setting in ("greedy", "T=0.7,top_k=5"):
        inputs = _round_inputs(4, 11, 300, 3, SETTINGS[setting], seed=4, dtype=torch.bfloat16)
        target_logits = inputs[2]
        target_logits[:, :, 200] = target_logits[:, :, 100] = target_logits.amax(-1) + 1  # a tie at the top
        expected = _assert_kernel_matches(inputs, VerifyBlocks(vocab=128))
        if setting == "greedy":
            assert (expected.next_token == 100).all()


def test_top_p_keeps_or_drops_tied_logits_whole():
    """probs 0.687, then three tied at 0.093, then 0.034: the tie falls whole on either side of
    top-p, whatever order a sort gives it, as the kernel (which never sorts) decides."""
    logits = torch.tensor([[3.0, 1.0, 1.0, 1.0, 0.0, -5.0]])
    assert (processed_probs(logits, 1.0, 0, 0.5)[0, 1:] == 0).all()
    kept = processed_probs(logits, 1.0, 0, 0.75)[0] > 0  # the cut falls inside the tie
    assert kept.tolist() == [True, True, True, True, False, False]


def test_kernel_matches_the_reference_when_logits_tie_at_the_top_p_boundary():
    """Logits rounded to integers tie in groups; top-p's cut often falls inside one (bf16 logits
    over a 128k vocabulary do that on a GPU: a reference that cut ties by sort order did not
    match the kernel there)."""
    for setting in ("T=1.2,top_p=0.8", "T=0.9,top_k=8,top_p=0.7"):
        inputs = list(_round_inputs(6, 9, 100, 4, SETTINGS[setting], seed=11))
        inputs[2] = inputs[2].round()
        _assert_kernel_matches(tuple(inputs), VerifyBlocks(rows=8, vocab=64))


def test_one_tree_shared_by_the_batch_through_a_stride_0_table():
    inputs = list(_round_inputs(3, 10, 40, 3, SETTINGS["T=1"], seed=5))
    inputs[0] = inputs[0][:1].expand(3, -1, -1)  # eval's layout.children.expand(B, ...)
    first = inputs[0][0]
    for b in range(3):
        for node in range(10):
            kids = first[node][first[node] >= 0]
            inputs[1][b, kids] = inputs[1][0, kids]
    _assert_kernel_matches(tuple(inputs))


# --- statistics: the kernel's sampled continuations follow the target -------------------------

VOCAB = 4
DRAWS = 50_000
DETECTABLE_TV = 0.02


class Tables:
    """Target logits for contexts of 0, 1 and 2 tokens and draft probabilities for 0 and 1
    (fixed random logits; token 3 can never be drafted)."""

    def __init__(self, setting, seed=0):
        generator = torch.Generator().manual_seed(seed)
        temperature, top_k, top_p = setting
        self.setting = setting
        self.logits = [torch.randn(*[VOCAB] * (i + 1), generator=generator) for i in range(3)]
        drafts = [torch.randn(*[VOCAB] * (i + 1), generator=generator) * 2 for i in range(2)]
        for draft in drafts:
            draft[..., VOCAB - 1] = float("-inf")
        self.draft = [processed_probs(draft, temperature, top_k, top_p) for draft in drafts]

    def exact(self):
        """P(x1, x2) = p(x1) p(x2 | x1), flattened to [V * V]."""
        first, second = (processed_probs(self.logits[i], *self.setting) for i in range(2))
        return (first.unsqueeze(1) * second).flatten()


def _kernel_round(tables, context, fanout, generator):
    """One round per row through the kernel: root -> fanout[0] children (-> fanout[1] each).
    context [n] (None = the empty context) -> (accept_len, path tokens [n, depth], next token)."""
    rows = DRAWS if context is None else context.numel()

    def lookup(table, level, *tokens):  # table row after the context and tokens [n, ...] of `level` dims
        index = (() if context is None else (context.view(-1, *[1] * level),)) + tokens
        return table[len(index)][index] if index else table[0].expand(rows, VOCAB)

    root_draft = lookup(tables.draft, 0)
    kids, _ = select_children(root_draft.log(), fanout[0], sampled=True, generator=generator)  # [n, c]
    parents = [-1] + [0] * fanout[0]
    tokens = [torch.zeros(rows, 1, dtype=torch.long), kids]
    logits = [lookup(tables.logits, 0).unsqueeze(1), lookup(tables.logits, 1, kids)]
    drafts = [root_draft.unsqueeze(1)]
    if len(fanout) == 1:
        drafts.append(torch.zeros(rows, fanout[0], VOCAB))
    else:
        kid_drafts = lookup(tables.draft, 1, kids)  # [n, c, V]
        grandkids, _ = select_children(kid_drafts.log().flatten(0, 1), fanout[1], True, generator)
        grandkids = grandkids.view(rows, -1)  # [n, c * g]
        parents += [1 + i // fanout[1] for i in range(fanout[0] * fanout[1])]
        tokens.append(grandkids)
        logits.append(lookup(tables.logits, 1, kids.repeat_interleave(fanout[1], 1), grandkids))
        drafts += [kid_drafts, torch.zeros(rows, grandkids.shape[1], VOCAB)]
    parents = torch.tensor([parents])
    children = _children(parents, len(fanout), max(fanout)).expand(rows, -1, -1)
    tokens, logits, drafts = (torch.cat(parts, dim=1) for parts in (tokens, logits, drafts))
    uniforms = draw_uniforms(rows, parents.shape[1], VOCAB, generator)
    # The largest blocks the kernel takes: the interpreter runs programs one after another.
    blocks = VerifyBlocks(rows=min(triton.next_power_of_2(rows), MAX_TILE // (SEARCH_DIGITS.value * VOCAB)))
    out = tree_verify_triton(
        children, tokens, logits, drafts, uniforms, len(fanout), *tables.setting, blocks=blocks
    )
    return out.accept_len, tokens.gather(1, out.path.clamp_min(0)), out.next_token


def test_the_sample_size_detects_a_tv_error_of_0_02():
    assert power_against(DETECTABLE_TV, dof=VOCAB * VOCAB - 1, draws=DRAWS) > 0.99


@pytest.mark.parametrize("setting", ["T=1", "T=0.7,top_k=3,top_p=0.9"])
def test_sampled_continuations_through_the_kernel_follow_the_target(setting):
    """Two tokens by tree verification in the kernel (3 children x 2 grandchildren; then 3
    children after a one-token round), 50k draws, against p(x1) p(x2 | x1): chi-square at
    alpha = 1e-4, power > 0.99 against any total-variation error >= 0.02."""
    tables = Tables({"T=1": (1.0, 0, 1.0), "T=0.7,top_k=3,top_p=0.9": (0.7, 3, 0.9)}[setting])
    generator = torch.Generator().manual_seed(1)
    accepted, path_tokens, next_token = _kernel_round(tables, None, (3, 2), generator)
    first = torch.where(accepted >= 1, path_tokens[:, 0], next_token)
    second = torch.where(accepted >= 2, path_tokens[:, 1], next_token)
    again = accepted == 0
    accepted, path_tokens, next_token = _kernel_round(tables, first[again], (3,), generator)
    second[again] = torch.where(accepted >= 1, path_tokens[:, 0], next_token)
    statistic, dof = chi_square(first * VOCAB + second, tables.exact())
    assert statistic < chi_square_critical(dof)


def test_bad_arguments_raise_a_clear_error():
    inputs = list(_round_inputs(2, 6, 10, 2, SETTINGS["T=1"], seed=0))
    with pytest.raises(ValueError, match="top_p=0"):
        tree_verify_triton(*inputs[:6], 1.0, 0, 0.0)
    with pytest.raises(ValueError, match="sampling needs float uniforms"):
        tree_verify_triton(*inputs[:4], None, *inputs[5:])
    with pytest.raises(ValueError, match="greedy .* takes no draft_probs"):
        tree_verify_reference(*inputs[:5], inputs[5], 0.0)
    with pytest.raises(ValueError, match="children must be integer"):
        tree_verify_reference(inputs[0][:, :-1], *inputs[1:])
    with pytest.raises(ValueError, match="VerifyBlocks.vocab=48"):
        VerifyBlocks(vocab=48)
    with pytest.raises(ValueError, match="exceed Triton's"):
        tree_verify_triton(*inputs, blocks=VerifyBlocks(rows=8192))
