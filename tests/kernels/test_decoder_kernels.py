"""The decoder on the kernel path: DRAFTER_KERNELS=triton puts the Triton tree metadata, tree
verification and KV compaction (under the interpreter) inside eval's decoder, as CUDA would."""

import pytest
import torch

from tests.kernels.triton_required import import_triton

import_triton()

from eval.decoder import SpeculativeDecoder, TreeDrafting  # noqa: E402
from eval.tree import causal_mask  # noqa: E402
from eval.verify import SamplingParams  # noqa: E402
from heads.target import CachedTarget  # noqa: E402
from kernels import kv_compact, registry, tree_metadata, tree_verify  # noqa: E402
from tests.eval.drafters import LMDrafter, perturbed_copy  # noqa: E402
from tests.helpers import tiny_llama  # noqa: E402

PROMPT = [5, 17, 33, 8, 90, 4]
NEW_TOKENS = 14
DRAFTING = TreeDrafting(depth=4, top_k=3, budget=10)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(num_layers=2, vocab_size=128, hidden_size=32, seed=0)


def _decoder(target):
    drafter = LMDrafter(perturbed_copy(target, noise=0.05), target_layer_ids=(1, 0))
    return SpeculativeDecoder(target, drafter, DRAFTING, max_len=48)


def _count_kernel_calls(monkeypatch) -> dict[str, int]:
    """Wrap the three Triton entry points the registry hands out; count their calls."""
    calls: dict[str, int] = {}
    for module, name in [
        (tree_verify, "tree_verify_triton"),
        (tree_metadata, "tree_metadata_triton"),
        (kv_compact, "compact_kv_triton"),
    ]:
        original = getattr(module, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


def test_greedy_tree_decoding_on_the_kernels_is_the_targets_own_with_a_compacted_cache(target, monkeypatch):
    ids = torch.tensor([PROMPT])
    expected = target.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS
    )
    calls = _count_kernel_calls(monkeypatch)
    monkeypatch.setenv(registry.ENV_VAR, "triton")
    decoder = _decoder(target)
    out = decoder.generate(PROMPT, NEW_TOKENS)

    assert out.tokens == expected[0, len(PROMPT) :].tolist()
    assert out.metrics.accepted_draft_tokens > 0  # paths were accepted, so KV entries moved
    assert set(calls) == {"tree_verify_triton", "tree_metadata_triton", "compact_kv_triton"}
    sequence = PROMPT + out.tokens
    committed = len(sequence) - 1  # the last token is never written (it would be the next root)
    cached = CachedTarget(target)
    direct = cached.new_cache(1, decoder.plain.cache_len)
    slots = torch.arange(committed)
    mask = causal_mask(0, committed, decoder.plain.cache_len, "cpu")
    cached.forward(torch.tensor([sequence[:committed]]), slots.unsqueeze(0), direct, slots, mask)
    for layer, reference in zip(decoder.plain.cache, direct):
        torch.testing.assert_close(
            layer.k[:, :, :committed], reference.k[:, :, :committed], rtol=1e-5, atol=1e-5
        )
        torch.testing.assert_close(
            layer.v[:, :, :committed], reference.v[:, :, :committed], rtol=1e-5, atol=1e-5
        )


def test_sampled_tree_decoding_draws_the_same_tokens_on_kernel_and_reference(target, monkeypatch):
    """The same generator seed gives the same tokens: both paths consume the same random
    numbers (kernels/tree_verify_reference.py's contract), only their arithmetic differs."""
    sampling = SamplingParams(temperature=0.8)  # top-k and top-p: tests/kernels/test_tree_verify.py
    runs = {}
    for impl in ("reference", "triton"):
        monkeypatch.setenv(registry.ENV_VAR, impl)
        runs[impl] = _decoder(target).generate(PROMPT, NEW_TOKENS, sampling, torch.Generator().manual_seed(3))
    assert runs["triton"].tokens == runs["reference"].tokens
    metrics = runs["triton"].metrics
    assert 0 < metrics.accepted_draft_tokens < metrics.proposed_tokens  # accepts and rejects both
