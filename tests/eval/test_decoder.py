import itertools
import time

import pytest
import torch

from eval.decoder import (
    ChainDrafting,
    HybridDrafting,
    MedusaTreeDrafting,
    NgramDrafting,
    SpeculativeDecoder,
    TreeDrafting,
)
from eval.drafting.eagle import compiled_draft_step
from eval.policies import DraftProbabilityThreshold, StaticDraftLength
from eval.tree import causal_mask
from eval.verify import SamplingParams, process_logits
from heads.draft_vocab import DraftVocab
from heads.eagle3 import Eagle3Head
from heads.kv_cache import KVCache
from heads.target import CachedTarget
from kernels import kv_compact_reference
from tests.eval.drafters import (
    DRAFTER_FEATURE,
    LMDrafter,
    TinyMedusa,
    eagle_drafter,
    greedy_reference,
    perturbed_copy,
)
from tests.eval.stats import chi_square, chi_square_critical
from tests.helpers import tiny_llama

MAX_LEN = 96
NEW_TOKENS = 40
PROMPTS = [[5, 17, 33, 8, 90, 4], [100, 3, 56], [7] * 12]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(num_layers=2, vocab_size=128, hidden_size=32, seed=0)


@pytest.fixture(scope="module")
def reference(target):
    return greedy_reference(target, PROMPTS, NEW_TOKENS)


DRAFTINGS = {
    "chain": ChainDrafting(StaticDraftLength(4)),
    "chain-threshold": ChainDrafting(DraftProbabilityThreshold(max_draft_len=6, threshold=0.3)),
    "tree": TreeDrafting(depth=4, top_k=3, budget=10),
    "hybrid": HybridDrafting(ChainDrafting(StaticDraftLength(4)), NgramDrafting(draft_length=4, min_ngram=2)),
}


@pytest.mark.parametrize("drafting", DRAFTINGS, ids=list(DRAFTINGS))
@pytest.mark.parametrize("kind", ["random", "good"])
def test_greedy_output_is_the_targets_own(target, reference, drafting, kind):
    decoder = SpeculativeDecoder(target, eagle_drafter(target, kind), DRAFTINGS[drafting], max_len=MAX_LEN)
    accepted = 0
    for prompt, expected in zip(PROMPTS, reference):
        plain = decoder.generate_plain(prompt, NEW_TOKENS)
        spec = decoder.generate(prompt, NEW_TOKENS)
        assert plain.tokens == expected
        assert spec.tokens == expected
        accepted += spec.metrics.accepted_draft_tokens
    if kind == "good":
        assert accepted > NEW_TOKENS  # the accept path is exercised, not just rejections


@pytest.fixture(scope="module")
def compilable_drafter(target):
    """One drafter for both compiled tests, so its steps compile once."""
    return eagle_drafter(target, "good", linears="torch")


@pytest.mark.parametrize("drafting", ["chain", "tree"])
def test_greedy_output_with_the_compiled_target_forward_is_the_targets_own(
    target, reference, compilable_drafter, drafting
):
    """linears=compiled: decode steps, chain and tree verifications and the drafter's steps
    through compiled graphs (frozen weights); the plain loop and the speculative decoder still
    emit the target's greedy tokens, with drafts accepted."""
    decoder = SpeculativeDecoder(
        target, compilable_drafter, DRAFTINGS[drafting], max_len=MAX_LEN, linears="compiled"
    )
    assert decoder.plain.target.compiled is not None
    assert decoder.strategy.eagle.step == decoder.strategy.eagle._compiled_step
    accepted = 0
    for prompt, expected in zip(PROMPTS, reference):
        assert decoder.generate_plain(prompt, NEW_TOKENS).tokens == expected
        generation = decoder.generate(prompt, NEW_TOKENS)
        assert generation.tokens == expected
        accepted += generation.metrics.accepted_draft_tokens
    assert accepted > NEW_TOKENS


@torch.no_grad()
def test_a_compiled_eagle3_step_computes_the_eager_step_and_is_shared():
    """What linears=compiled runs for an EAGLE-3 head: its step through torch.compile, the cache
    given as tensors; a catch-up of a few tokens (logits for its last only), then one-token and
    two-token steps."""
    target = tiny_llama(num_layers=3)
    head = Eagle3Head.from_target(
        target.config,
        embed_weight=target.model.embed_tokens.weight,
        draft_vocab=DraftVocab.full(target.config.vocab_size),
        target_layer_ids=[0, 1, 2],
    ).eval()
    step = compiled_draft_step(head, torch.device("cpu"))
    assert compiled_draft_step(head, torch.device("cpu")) is step  # one compilation per head
    eager_cache, compiled_cache = (head.new_cache(1, 16, "cpu", torch.float32) for _ in range(2))
    for start, length, num_logits in [(0, 5, 1), (5, 1, 1), (6, 2, None)]:
        features = torch.randn(1, length, 32)
        input_ids = torch.randint(0, 128, (1, length))
        slots = torch.arange(start, start + length)
        mask = causal_mask(start, length, 16, "cpu")
        expected = head.step(features, input_ids, slots.unsqueeze(0), eager_cache, slots, mask, num_logits)
        keys, values = [layer.k for layer in compiled_cache], [layer.v for layer in compiled_cache]
        got = step(features, input_ids, slots.unsqueeze(0), keys, values, slots, mask, num_logits)
        assert got[1].shape[1] == (num_logits or length)
        for got_tensor, expected_tensor in zip(got, expected):
            torch.testing.assert_close(got_tensor, expected_tensor, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(compiled_cache[0].k, eager_cache[0].k, rtol=1e-4, atol=1e-4)


def test_greedy_medusa_tree_is_the_targets_own(target, reference):
    decoder = SpeculativeDecoder(target, TinyMedusa(target), MedusaTreeDrafting(), max_len=MAX_LEN)
    for prompt, expected in zip(PROMPTS, reference):
        assert decoder.generate(prompt, NEW_TOKENS).tokens == expected


def test_the_real_medusa_head_decodes_as_the_target(target, reference):
    """The head class training saves, not a stand-in (its forward returns states, not logits)."""
    from heads.medusa import MedusaArgs, MedusaHead

    torch.manual_seed(0)
    args = MedusaArgs(hidden_size=32, vocab_size=128, num_heads=4, num_layers=1)
    head = MedusaHead(args, lm_head_weight=target.lm_head.weight.detach()).eval()
    decoder = SpeculativeDecoder(target, head, MedusaTreeDrafting(), max_len=MAX_LEN)
    for prompt, expected in zip(PROMPTS, reference):
        generation = decoder.generate(prompt, NEW_TOKENS)
        assert generation.tokens == expected
        assert generation.metrics.proposed_tokens > 0


@pytest.mark.parametrize("drafting", ["chain", "tree"])
def test_the_real_eagle3_head_decodes_as_the_target(target, reference, drafting):
    """The head class training saves, over a reduced draft vocabulary (96 of 128 ids)."""
    from heads.draft_vocab import build_draft_vocab
    from heads.eagle3 import Eagle3Head

    torch.manual_seed(0)
    head = Eagle3Head.from_target(
        target.config,
        embed_weight=target.model.embed_tokens.weight,
        draft_vocab=build_draft_vocab(torch.arange(128, 0, -1), 96),
        target_layer_ids=[0, 1, 1],
        lm_head_weight=target.lm_head.weight,
    ).eval()
    decoder = SpeculativeDecoder(target, head, DRAFTINGS[drafting], max_len=MAX_LEN)
    for prompt, expected in zip(PROMPTS, reference):
        generation = decoder.generate(prompt, NEW_TOKENS)
        assert generation.tokens == expected
        assert generation.metrics.proposed_tokens > 0


def full_sequence_cache(model, tokens: list[int], cache_len: int) -> list[KVCache]:
    cached = CachedTarget(model)
    cache = cached.new_cache(1, cache_len)
    slots = torch.arange(len(tokens))
    mask = causal_mask(0, len(tokens), cache_len, "cpu")
    cached.forward(torch.tensor([tokens]), slots.unsqueeze(0), cache, slots, mask)
    return cache


def test_kv_cache_after_partly_accepted_trees_equals_direct_decoding(target, monkeypatch):
    moves = []
    compact = kv_compact_reference.compact_kv_reference  # what the registry runs on CPU

    def recording_compact(caches, src_positions, path_lengths, dst_starts):
        moves.append((src_positions[0, : int(path_lengths[0])].tolist(), int(dst_starts[0])))
        compact(caches, src_positions, path_lengths, dst_starts)

    monkeypatch.setattr(kv_compact_reference, "compact_kv_reference", recording_compact)
    drafter = eagle_drafter(target, "good")
    decoder = SpeculativeDecoder(target, drafter, TreeDrafting(depth=4, top_k=3, budget=10), max_len=MAX_LEN)
    prompt = PROMPTS[0]
    out = decoder.generate(prompt, NEW_TOKENS)
    # Some accepted path was not already in sequence order: compaction really moved entries.
    assert any(src != list(range(dst, dst + len(src))) for src, dst in moves)
    sequence = prompt + out.tokens
    committed = len(sequence) - 1  # the last token is never written (it would be the next root)
    direct = full_sequence_cache(target, sequence[:committed], decoder.plain.cache_len)
    for layer, expected in zip(decoder.plain.cache, direct):
        torch.testing.assert_close(
            layer.k[:, :, :committed], expected.k[:, :, :committed], rtol=1e-5, atol=1e-5
        )
        torch.testing.assert_close(
            layer.v[:, :, :committed], expected.v[:, :, :committed], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("drafting", ["chain", "tree", "hybrid"])
def test_drafter_sees_each_target_feature_with_the_next_token(target, drafting):
    """EAGLE's shift: the feature of position t, the token at t + 1, RoPE position t (after a
    hybrid's n-gram rounds too, which leave their positions for the head's next catch-up)."""
    drafter = eagle_drafter(target, "good")
    decoder = SpeculativeDecoder(target, drafter, DRAFTINGS[drafting], max_len=MAX_LEN)
    prompt = PROMPTS[0]
    sequence = prompt + decoder.generate(prompt, NEW_TOKENS).tokens
    with torch.no_grad():
        final_hidden = target(torch.tensor([sequence]), output_hidden_states=True).hidden_states[-1][0]
    covered = []
    for call in drafter.calls:
        for column, position in enumerate(call["positions"][0].tolist()):
            feature = call["features"][0, column]
            if feature[0] == DRAFTER_FEATURE:
                continue  # drafting on the drafter's own hidden state
            torch.testing.assert_close(feature, final_hidden[position], rtol=1e-4, atol=1e-4)
            assert call["input_ids"][0, column] == sequence[position + 1]
            covered.append(position)
    assert sorted(covered) == list(range(len(covered)))  # each position once, none skipped
    if drafting == "hybrid":  # positions after the last head round stay pending
        assert len(covered) > len(prompt) and decoder.strategy.rounds["ngram"] > 0
    else:
        assert len(covered) >= len(sequence) - 1 - 8  # all but the last round's commits


@pytest.mark.parametrize("drafting", DRAFTINGS, ids=list(DRAFTINGS))
def test_counters_follow_the_spec(target, drafting):
    decoder = SpeculativeDecoder(target, eagle_drafter(target, "good"), DRAFTINGS[drafting], max_len=MAX_LEN)
    for prompt in PROMPTS:
        out = decoder.generate(prompt, NEW_TOKENS)
        metrics = out.metrics
        assert len(out.tokens) == NEW_TOKENS
        assert metrics.emitted_tokens == NEW_TOKENS - 1  # the prefill's token is not a round's
        assert metrics.emitted_tokens == metrics.accepted_draft_tokens + metrics.verification_rounds
        assert 1 <= metrics.acceptance_length <= 1 + decoder.num_positions
        assert metrics.accepted_draft_tokens <= metrics.proposed_tokens
        assert (
            metrics.accepted_per_position[0]
            <= metrics.proposed_per_position[0]
            <= metrics.verification_rounds
        )
        assert sum(metrics.accepted_per_position) == metrics.accepted_draft_tokens
        # Per position, reaching position i + 1 requires reaching position i.
        assert metrics.accepted_per_position == sorted(metrics.accepted_per_position, reverse=True)
        # The drafts each round's drafter computed, which price its drafting (eval/report.py).
        drafted, proposed = metrics.drafted_per_position, metrics.proposed_per_position
        assert drafted == sorted(drafted, reverse=True)
        if drafting == "chain":  # a static chain verifies every draft it computed
            assert drafted == proposed
        elif drafting == "chain-threshold":  # it may stop on a draft it then does not verify
            assert all(d >= p for d, p in zip(drafted, proposed)) and drafted[0] > 0
        elif drafting == "tree":  # a tree is priced by its full round
            assert not any(drafted)
        else:  # hybrid: an n-gram round computes no drafts
            assert all(d <= p for d, p in zip(drafted, proposed)) and drafted[0] < proposed[0]


@pytest.mark.parametrize("drafting", ["chain", "tree", "hybrid"])
def test_eos_stops_output_and_tokens_after_it_do_not_count(target, drafting):
    prompt = PROMPTS[0]
    free_run = SpeculativeDecoder(target, eagle_drafter(target, "good"), DRAFTINGS[drafting], MAX_LEN)
    free_tokens = free_run.generate(prompt, NEW_TOKENS).tokens
    cut_inside_a_round = 0
    for eos in sorted(set(free_tokens[1:])):  # each generated token in turn plays EOS
        decoder = SpeculativeDecoder(
            target, eagle_drafter(target, "good"), DRAFTINGS[drafting], MAX_LEN, eos_token_id=eos
        )
        out = decoder.generate(prompt, NEW_TOKENS)
        stop = free_tokens.index(eos)
        assert out.stopped_by_eos and out.tokens == free_tokens[: stop + 1]
        metrics = out.metrics
        assert metrics.emitted_tokens == len(out.tokens) - 1
        corrections = metrics.emitted_tokens - metrics.accepted_draft_tokens
        # Each round emits one target token, except a last round cut by an EOS among its accepted drafts.
        assert corrections in (metrics.verification_rounds, metrics.verification_rounds - 1)
        cut_inside_a_round += corrections == metrics.verification_rounds - 1
    assert cut_inside_a_round > 0  # the case where accepted drafts after EOS are dropped did occur


def test_short_budgets_cap_the_draft_instead_of_cutting(target):
    decoder = SpeculativeDecoder(target, eagle_drafter(target, "good"), DRAFTINGS["chain"], max_len=MAX_LEN)
    for new_tokens in (1, 2, 3):
        out = decoder.generate(PROMPTS[0], new_tokens)
        assert len(out.tokens) == new_tokens
        assert out.metrics.emitted_tokens == new_tokens - 1
        assert out.metrics.proposed_tokens <= max(new_tokens - 2, 0)


def test_bad_requests_and_configs_are_refused(target):
    drafter = eagle_drafter(target, "random")
    with pytest.raises(ValueError, match="draft length K=0"):
        StaticDraftLength(0)
    with pytest.raises(ValueError, match="draft length K=1000"):
        StaticDraftLength(1000)
    with pytest.raises(ValueError, match="tree budget=0"):
        TreeDrafting(depth=3, top_k=2, budget=0)
    with pytest.raises(ValueError, match="tree budget=100000"):
        TreeDrafting(depth=3, top_k=2, budget=100000)
    with pytest.raises(ValueError, match="tree top_k=0"):
        TreeDrafting(depth=3, top_k=0, budget=4)
    with pytest.raises(ValueError, match="rank 0 under \\(\\) is missing"):
        MedusaTreeDrafting(paths=((1,),))
    with pytest.raises(ValueError, match="max_len=100000"):
        SpeculativeDecoder(target, drafter, DRAFTINGS["chain"], max_len=100_000)
    decoder = SpeculativeDecoder(target, drafter, DRAFTINGS["chain"], max_len=16)
    with pytest.raises(ValueError, match="prompt of 12 tokens \\+ max_new_tokens=8 exceeds .* max_len=16"):
        decoder.generate([7] * 12, 8)
    with pytest.raises(ValueError, match="batch size 1"):
        decoder.generate(torch.ones(2, 3, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        decoder.generate([1, 2], 0)
    with pytest.raises(ValueError, match="temperature=-1"):
        decoder.generate([1, 2], 2, SamplingParams(temperature=-1.0))
    with pytest.raises(ValueError, match="top_p=0"):
        decoder.generate([1, 2], 2, SamplingParams(temperature=1.0, top_p=0.0))
    with pytest.raises(ValueError, match="top_p=1.5"):
        SamplingParams(temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match="top_k=-1"):
        SamplingParams(temperature=1.0, top_k=-1)
    foreign = LMDrafter(tiny_llama(vocab_size=256, seed=3))
    with pytest.raises(ValueError, match="outside the target vocabulary of 128"):
        SpeculativeDecoder(target, foreign, DRAFTINGS["chain"], max_len=16)


def exact_continuations(model, prompt: list[int], length: int, sampling: SamplingParams) -> torch.Tensor:
    """P(x1..x_length | prompt) under the processed target, for every continuation [V ** length]."""
    vocab = model.config.vocab_size
    continuations = torch.cartesian_prod(*[torch.arange(vocab)] * length)  # [V ** length, length]
    sequences = torch.cat([torch.tensor(prompt).expand(len(continuations), -1), continuations], dim=1)
    with torch.no_grad():
        logits = model(sequences).logits[:, len(prompt) - 1 : -1]  # [n, length, V]
    probs = process_logits(logits, sampling).gather(-1, continuations.unsqueeze(-1)).squeeze(-1)
    return probs.prod(dim=-1)


E2E_DRAFTINGS = {
    "chain": ChainDrafting(StaticDraftLength(3)),
    "chain-block": ChainDrafting(StaticDraftLength(3)),  # block verification (below)
    "tree": TreeDrafting(depth=3, top_k=2, budget=6),
    "medusa": MedusaTreeDrafting(),
    "hybrid": HybridDrafting(ChainDrafting(StaticDraftLength(3)), NgramDrafting(draft_length=3)),
}


@pytest.mark.parametrize("drafting", E2E_DRAFTINGS)
def test_sampled_generations_follow_the_target_end_to_end(drafting):
    """The full decoder at T = 0.9, top_p = 0.95 on a 4-token vocabulary: the first 3 of 5
    generated tokens (so drafts run 3 deep) against the exact target distribution.

    A check of the wiring (draft vocab mapping, tree building, processing): 600 runs
    detect a total-variation error of ~0.2 with power 0.9; the power against 0.02 is
    tests/eval/test_verify.py's, on the same verify functions.
    """
    vocab, prompt, runs, sampling = 4, [1, 0, 3], 600, SamplingParams(temperature=0.9, top_p=0.95)
    target = tiny_llama(vocab_size=vocab, seed=2)
    if drafting == "medusa":
        drafter = TinyMedusa(target)
    else:  # a reduced draft vocabulary: token 3 can never be drafted
        drafter = LMDrafter(perturbed_copy(target, noise=0.5), draft_token_ids=torch.tensor([0, 1, 2]))
    verification = "block" if drafting == "chain-block" else "token"
    decoder = SpeculativeDecoder(
        target, drafter, E2E_DRAFTINGS[drafting], max_len=8, eos_token_id=[], verification=verification
    )
    generator = torch.Generator().manual_seed(0)
    samples, accepted = [], 0
    for _ in range(runs):
        out = decoder.generate(prompt, 5, sampling, generator)
        samples.append(out.tokens[0] * vocab**2 + out.tokens[1] * vocab + out.tokens[2])
        accepted += out.metrics.accepted_draft_tokens
    assert 0 < accepted < 4 * runs  # both acceptances and rejections happened
    statistic, dof = chi_square(torch.tensor(samples), exact_continuations(target, prompt, 3, sampling))
    assert statistic < chi_square_critical(dof)


@pytest.mark.integration
@pytest.mark.parametrize("drafting", ["chain", "tree"])
def test_greedy_output_on_the_embedded_target(smollm2, drafting):
    """The same guarantee on SmolLM2-135M; swap the perturbed copy for a trained head later."""
    model, tokenizer = smollm2.model, smollm2.tokenizer
    messages = [{"role": "user", "content": "Name three prime numbers and explain why they are prime."}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    prompt = list(encoded["input_ids"])
    ids = torch.tensor([prompt])
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24)
    drafter = LMDrafter(perturbed_copy(model, noise=0.02), target_layer_ids=(1, 14, 26))
    decoder = SpeculativeDecoder(model, drafter, DRAFTINGS[drafting], max_len=len(prompt) + 24)
    out = decoder.generate(prompt, 24)
    assert out.tokens == expected[0, len(prompt) :].tolist()
    assert out.metrics.accepted_draft_tokens > 0


def test_ngram_drafting_is_greedy_exact_and_accepts_on_repeated_text(target, reference):
    decoder = SpeculativeDecoder(target, None, NgramDrafting(draft_length=4, max_ngram=2), max_len=MAX_LEN)
    proposed = accepted = 0
    for prompt, expected in zip(PROMPTS, reference):
        out = decoder.generate(prompt, NEW_TOKENS)
        assert out.tokens == expected
        proposed += out.metrics.proposed_tokens
        accepted += out.metrics.accepted_draft_tokens
    assert accepted > 0 and proposed > accepted  # a random tiny model repeats itself: lookups pay


def test_ngram_sampled_generations_follow_the_target():
    """As the end-to-end sampling test above (600 runs, TV ~0.2 detectable), with one-hot drafts."""
    vocab, prompt, runs, sampling = 4, [1, 0, 3, 1, 0, 3, 1], 600, SamplingParams(temperature=0.9, top_p=0.95)
    target = tiny_llama(vocab_size=vocab, seed=2)
    decoder = SpeculativeDecoder(target, None, NgramDrafting(draft_length=3), max_len=16, eos_token_id=[])
    generator = torch.Generator().manual_seed(0)
    samples, accepted, proposed = [], 0, 0
    for _ in range(runs):
        out = decoder.generate(prompt, 5, sampling, generator)
        samples.append(out.tokens[0] * vocab**2 + out.tokens[1] * vocab + out.tokens[2])
        accepted += out.metrics.accepted_draft_tokens
        proposed += out.metrics.proposed_tokens
    assert 0 < accepted < proposed  # both acceptances and rejections happened
    statistic, dof = chi_square(torch.tensor(samples), exact_continuations(target, prompt, 3, sampling))
    assert statistic < chi_square_critical(dof)


def test_hybrid_drafts_from_the_text_where_it_matches_and_from_the_head_elsewhere(target, reference):
    decoder = SpeculativeDecoder(
        target, eagle_drafter(target, "random"), DRAFTINGS["hybrid"], max_len=MAX_LEN
    )
    for prompt, expected in zip(PROMPTS, reference):
        assert decoder.generate(prompt, NEW_TOKENS).tokens == expected
    rounds = decoder.strategy.rounds
    assert rounds["ngram"] > 0 and rounds["head"] > 0


def test_a_slow_spell_of_the_machine_does_not_bend_the_measured_costs(target):
    """Ten forwards in a row 20 ms slower (another process's burst): timed in blocks, they would
    make one forward length look many times dearer than a step, or a step dearer than a
    verification; timed in reps, each ratio over its own rep's step, they move one or two reps."""
    decoder = SpeculativeDecoder(target, eagle_drafter(target, "good"), DRAFTINGS["chain"], max_len=MAX_LEN)
    forward, calls = decoder.plain.forward, itertools.count()

    def forward_with_a_spell(*args, **kwargs):
        if 10 <= next(calls) < 20:
            time.sleep(0.02)
        return forward(*args, **kwargs)

    decoder.plain.forward = forward_with_a_spell
    costs = decoder.measure_costs(contexts=(16,), reps=8)["16"]
    assert next(calls) > 20  # the spell happened inside the timings
    assert max(costs["verify_costs"]) < 3 and costs["beta"] > -0.5


def test_costs_are_measured_per_context_bucket(target):
    """alpha times the strategy's whole round (catch-up included), beta the verify forward;
    contexts that do not fit the cache are left out, and one that fits is always timed."""
    decoder = SpeculativeDecoder(target, eagle_drafter(target, "good"), DRAFTINGS["chain"], max_len=MAX_LEN)
    costs = decoder.measure_costs(contexts=(16, 48, 4096), reps=2)
    assert list(costs) == ["16", "48"]
    for context, bucket in costs.items():
        assert bucket["context_tokens"] == int(context)
        assert bucket["alpha"] > 0 and bucket["target_step_ms"] > 0
        assert len(bucket["verify_costs"]) == 5 and bucket["verify_costs"][0] == 1.0
        # Drafting 0..4 drafts: nothing costs nothing, four is the whole round alpha times.
        assert len(bucket["draft_costs"]) == 5 and bucket["draft_costs"][0] == 0.0
        assert bucket["draft_costs"][-1] == bucket["alpha"] and min(bucket["draft_costs"][1:]) > 0
        assert bucket["break_even_acceptance_length"] == 1 + bucket["alpha"] + bucket["beta"]
    assert list(decoder.measure_costs(contexts=(4096,), reps=1)) == [str(MAX_LEN - 5 - 2)]
    tree = SpeculativeDecoder(target, eagle_drafter(target, "good"), DRAFTINGS["tree"], max_len=MAX_LEN)
    forward, trees = tree.plain.forward, []
    tree.plain.forward = lambda ids, start, shape=None, **kw: (
        trees.append(shape) or forward(ids, start, shape, **kw)
    )
    assert not {"verify_costs", "draft_costs"} & set(tree.measure_costs(contexts=(16,), reps=1)["16"])
    assert any(shape is not None for shape in trees)  # its verification timed through the tree path
    tree.plain.forward = forward
    # The decoder still decodes exactly after its caches served the timings.
    assert (
        decoder.generate(PROMPTS[0], NEW_TOKENS).tokens
        == greedy_reference(target, PROMPTS[:1], NEW_TOKENS)[0]
    )
