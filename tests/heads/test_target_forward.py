from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from transformers import (
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from eval.tree import causal_mask, tree_attention_mask, tree_layout
from heads.blocks import attended_first, grouped_attention
from heads.machine import native_bf16
from heads.target import CachedTarget, Target
from tests.helpers import tiny_llama

MAX_LEN = 32


SMALL = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def tiny_qwen3():
    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(head_dim=8, **SMALL)).eval()


def tiny_qwen2():
    """Qwen2's q/k/v projections carry biases."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SMALL)).eval()
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    return model


def tiny_mistral(sliding_window=None):
    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(sliding_window=sliding_window, **SMALL)).eval()


def full_forward(target: CachedTarget, input_ids: torch.Tensor, layer_ids):
    length = input_ids.shape[1]
    cache = target.new_cache(1, MAX_LEN)
    positions = torch.arange(length).unsqueeze(0)
    mask = causal_mask(0, length, MAX_LEN, "cpu")
    return target.forward(input_ids, positions, cache, torch.arange(length), mask, layer_ids), cache


FAMILIES = [tiny_llama, tiny_qwen2, tiny_qwen3, tiny_mistral]
FAMILY_IDS = ["llama", "qwen2", "qwen3", "mistral"]


@pytest.mark.parametrize("build", FAMILIES, ids=FAMILY_IDS)
def test_cached_forward_equals_hf_forward(build):
    model = build()
    target = CachedTarget(model)
    input_ids = torch.randint(0, 128, (1, 11))
    last = target.num_layers - 1
    out, _ = full_forward(target, input_ids, layer_ids=[last, 0])
    with torch.no_grad():
        reference = model(input_ids, output_hidden_states=True)
    torch.testing.assert_close(out.logits, reference.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.hidden_states[1], reference.hidden_states[1], rtol=1e-5, atol=1e-5)
    # HF's last entry is after the final norm; our layer ids are pre-norm (docs/ARCHITECTURE.md).
    last_normed = model.model.norm(out.hidden_states[0])
    torch.testing.assert_close(last_normed, reference.hidden_states[last + 1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.final_hidden, reference.hidden_states[-1], rtol=1e-5, atol=1e-5)


def test_incremental_decoding_equals_full_forward():
    target = CachedTarget(tiny_llama())
    input_ids = torch.randint(0, 128, (1, 12))
    full, full_cache = full_forward(target, input_ids, layer_ids=[0])
    cache = target.new_cache(1, MAX_LEN)
    pieces = [(0, 5), (5, 6), (6, 9), (9, 12)]  # a prefill, one token, then chunks
    logits = []
    for start, end in pieces:
        slots = torch.arange(start, end)
        # Attend to a bucket shorter than the cache: slots beyond it are never needed.
        mask = causal_mask(start, end - start, 16, "cpu")
        logits.append(target.forward(input_ids[:, start:end], slots.unsqueeze(0), cache, slots, mask).logits)
    torch.testing.assert_close(torch.cat(logits, dim=1), full.logits, rtol=1e-5, atol=1e-5)
    for layer, reference in zip(cache, full_cache):
        torch.testing.assert_close(layer.k, reference.k, rtol=1e-5, atol=1e-5)


def test_compiled_forward_equals_the_torch_path_and_is_shared_across_caches():
    """linears=compiled (torch.compile, frozen weights) computes the modules' forward, for a
    prefill, one token and a few (every decode and verify shape), with the layers picked by id;
    a second forward object and cache over the same model reuse the first one's compilation."""
    model = tiny_qwen2()  # q/k/v biases
    reference = CachedTarget(model, linears="torch")
    compiled = [CachedTarget(model, linears="compiled") for _ in range(2)]
    assert compiled[0].compiled is compiled[1].compiled is not None
    input_ids = torch.randint(0, 128, (1, 12))
    caches = [target.new_cache(1, MAX_LEN) for target in (reference, *compiled)]
    graphs_before = counters["stats"]["unique_graphs"]
    for start, end in [(0, 5), (5, 6), (6, 9), (9, 12)]:
        slots = torch.arange(start, end)
        mask = causal_mask(start, end - start, 16, "cpu")
        args = input_ids[:, start:end], slots.unsqueeze(0)
        expected = reference.forward(*args, caches[0], slots, mask, layer_ids=[1, 0])
        for target, cache in zip(compiled, caches[1:]):
            got = target.forward(*args, cache, slots, mask, layer_ids=[1, 0])
            torch.testing.assert_close(got.logits, expected.logits, rtol=1e-4, atol=1e-4)
            for got_hidden, expected_hidden in zip(got.hidden_states, expected.hidden_states):
                torch.testing.assert_close(got_hidden, expected_hidden, rtol=1e-4, atol=1e-4)
    for cache in caches[1:]:
        for layer, expected_layer in zip(cache, caches[0]):
            torch.testing.assert_close(layer.v, expected_layer.v, rtol=1e-4, atol=1e-4)
    # One token, and every other count: the second cache compiled nothing of its own.
    assert counters["stats"]["unique_graphs"] - graphs_before == 2
    with pytest.raises(ValueError, match="choose one of"):
        CachedTarget(model, linears="jit")


def test_tree_forward_scores_each_branch_as_its_own_sequence():
    target = CachedTarget(tiny_llama())
    prompt = torch.randint(0, 128, (1, 6))
    # Root (last prompt token) with two branches: [a, b] and [c].
    parents = torch.tensor([-1, 0, 1, 0])
    layout = tree_layout(parents, max_depth=2, max_children=2)
    tree_tokens = torch.tensor([[prompt[0, -1], 7, 9, 11]])
    cache = target.new_cache(1, MAX_LEN)
    prefix = prompt[:, :-1]
    slots = torch.arange(5)
    target.forward(prefix, slots.unsqueeze(0), cache, slots, causal_mask(0, 5, MAX_LEN, "cpu"))
    positions = 5 + layout.depths
    tree_slots = torch.arange(5, 9)
    mask = tree_attention_mask(layout, prefix_len=5, kv_len=MAX_LEN)
    tree_logits = target.forward(tree_tokens, positions.unsqueeze(0), cache, tree_slots, mask).logits
    branch_ab = torch.cat([prompt, torch.tensor([[7, 9]])], dim=1)
    branch_c = torch.cat([prompt, torch.tensor([[11]])], dim=1)
    ab_logits, _ = full_forward(target, branch_ab, layer_ids=())
    c_logits, _ = full_forward(target, branch_c, layer_ids=())
    torch.testing.assert_close(tree_logits[:, [0, 1, 2]], ab_logits.logits[:, -3:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tree_logits[:, 3], c_logits.logits[:, -1], rtol=1e-5, atol=1e-5)


def test_unsupported_architectures_and_layer_ids_are_refused():
    target = CachedTarget(tiny_llama())
    with pytest.raises(ValueError, match="layer ids \\[5\\] out of range"):
        full_forward(target, torch.zeros(1, 2, dtype=torch.long), layer_ids=[5])
    model = tiny_llama()
    model.config.model_type = "gemma"
    with pytest.raises(ValueError, match="model_type 'gemma' is not supported"):
        CachedTarget(model)
    with pytest.raises(ValueError, match="sliding-window attention \\(window 16\\)"):
        CachedTarget(tiny_mistral(sliding_window=16)).new_cache(1, MAX_LEN)


@pytest.mark.parametrize("build", FAMILIES, ids=FAMILY_IDS)
def test_rows_written_at_their_own_slots_equal_rows_decoded_alone(build):
    """A batched decode step (cache_positions [B, 1], each row at its own length) gives each
    row what decoding it alone gives."""
    target = CachedTarget(build())
    prompts = [torch.randint(0, 128, (1, n)) for n in (3, 7, 5)]
    alone = [full_forward(target, p, layer_ids=())[0].logits[:, -1] for p in prompts]
    cache = target.new_cache(3, MAX_LEN)
    for b, prompt in enumerate(prompts):  # prefill every row but its last token, alone
        slots = torch.arange(prompt.shape[1] - 1)
        mask = causal_mask(0, len(slots), MAX_LEN, "cpu")
        target.forward(
            prompt[:, :-1], slots.unsqueeze(0), [layer.rows(b, b + 1) for layer in cache], slots, mask
        )
    lengths = torch.tensor([[p.shape[1] - 1] for p in prompts])  # [B, 1]
    mask = (torch.arange(MAX_LEN)[None, :] <= lengths)[:, None, None, :]
    last = torch.cat([p[:, -1:] for p in prompts])
    batched = target.forward(last, lengths, cache, lengths, mask).logits[:, -1]
    torch.testing.assert_close(batched, torch.cat(alone), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("build", FAMILIES, ids=FAMILY_IDS)
def test_whole_row_forward_without_a_cache_equals_the_cached_one(build):
    target = CachedTarget(build())
    input_ids = torch.randint(0, 128, (2, 9))
    cached, _ = full_forward(target, input_ids[:1], layer_ids=[0])
    uncached = target.forward(input_ids, torch.arange(9).unsqueeze(0), None, None, None, [0])
    torch.testing.assert_close(uncached.logits[:1], cached.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(uncached.hidden_states[0][:1], cached.hidden_states[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads, kv_heads, batch_mask", [(4, 2, True), (6, 3, False), (4, 4, True)])
def test_grouped_attention_equals_torch_attention(heads, kv_heads, batch_mask):
    """The bf16 CPU path: per-row masks (batched decode), one mask for all rows (a tree), GQA."""
    torch.manual_seed(0)
    batch, length, kv_len = 3, 4, 10
    query = torch.randn(batch, heads, length, 8, dtype=torch.float64)
    key, value = (torch.randn(batch, kv_heads, kv_len, 8, dtype=torch.float64) for _ in range(2))
    mask = torch.rand(batch if batch_mask else 1, 1, length, kv_len) < 0.6
    mask[..., 0] = True  # every query attends somewhere
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.3, enable_gqa=True)
    # Its softmax runs in fp32: equal to fp32 rounding; a wrong head grouping or mask is off by O(1).
    torch.testing.assert_close(
        grouped_attention(query, key, value, mask, 0.3), expected, rtol=1e-5, atol=1e-6
    )


def test_a_bf16_target_decodes_as_its_fp32_self_within_bf16_rounding():
    """bf16 on a CPU takes grouped_attention in cached steps: batched rows and a prefill
    stay within bf16's rounding of the fp32 forward (which takes torch's fused kernel)."""
    model = tiny_llama()
    reference = CachedTarget(model)
    low = CachedTarget(tiny_llama().to(torch.bfloat16))
    prompts = torch.randint(0, 128, (2, 9))
    outputs = []
    for target in (reference, low):
        cache = target.new_cache(2, MAX_LEN)
        slots = torch.arange(9)
        mask = causal_mask(0, 9, 16, "cpu")
        outputs.append(target.forward(prompts, slots.unsqueeze(0), cache, slots, mask).logits.float())
    assert (outputs[1] - outputs[0]).abs().max() < 0.05 * outputs[0].abs().max()
    assert torch.equal(outputs[1].argmax(-1), outputs[0].argmax(-1))


@pytest.mark.skipif(not native_bf16(torch.device("cpu")), reason="a property of a CPU with native bf16")
@pytest.mark.parametrize("linears", ["auto", "torch"])
def test_on_a_native_bf16_cpu_a_bf16_verification_gives_its_decode_steps_logits_bit_for_bit(
    smollm2_cfg, linears
):
    """Why bf16 speculation is lossless on a CPU with AMX or avx512_bf16: k tokens verified in one
    forward score exactly as k decode steps, so greedy speculative output equals the bf16 plain
    loop (BENCHMARKS.md, sessions 27 and 28). Without AMX this holds because a step's one-row
    products run as several rows (heads/packed_linear.py, WidenedOneRow); before that, logits were
    up to 0.4 apart there (session 22)."""
    target = CachedTarget(Target.load(replace(smollm2_cfg, dtype="bfloat16")).model, linears=linears)
    torch.manual_seed(0)
    ids = torch.randint(0, target.config.vocab_size, (1, 41))
    context, k, max_len = 32, 9, 48

    def prefilled():
        cache, slots = target.new_cache(1, max_len), torch.arange(context)
        target.forward(
            ids[:, :context], slots.unsqueeze(0), cache, slots, causal_mask(0, context, max_len, "cpu")
        )
        return cache

    def step(cache, start, length):
        slots = torch.arange(start, start + length)
        mask = causal_mask(start, length, max_len, "cpu")
        return target.forward(ids[:, start : start + length], slots.unsqueeze(0), cache, slots, mask).logits[
            0
        ]

    verified, stepped = step(prefilled(), context, k), prefilled()
    for j in range(k):
        assert torch.equal(verified[j], step(stepped, context + j, 1)[-1]), f"token {j}"


def test_tree_rows_attend_their_keys_gathered_to_where_a_decode_step_has_them():
    """attended_first puts each row's attended slots first, in slot order; grouped_attention given
    that order computes every tree row exactly as a one-row step over the prefix and the row's
    ancestors laid out contiguously (what decoding the row's branch token by token sees)."""
    torch.manual_seed(0)
    prefix, kv_len, heads, kv_heads, dim = 5, 16, 6, 2, 8
    layout = tree_layout(torch.tensor([-1, 0, 0, 1, 2, 3]), max_depth=3, max_children=2)
    mask = tree_attention_mask(layout, prefix_len=prefix, kv_len=kv_len)  # [1, 1, 6, 16]
    order, row_mask = attended_first(mask)
    attended = [torch.nonzero(row).flatten() for row in mask[0, 0]]
    for row, slots in enumerate(attended):
        assert torch.equal(order[0, row, : len(slots)], slots)  # ascending: prefix, ancestors, itself
        assert row_mask[0, 0, row].sum() == len(slots) and row_mask[0, 0, row, : len(slots)].all()
    query = torch.randn(1, heads, 6, dim)
    key, value = (torch.randn(1, kv_heads, kv_len, dim) for _ in range(2))
    rows = grouped_attention(query, key, value, row_mask, 0.3, order)
    for row, slots in enumerate(attended):
        alone = grouped_attention(
            query[:, :, row : row + 1],
            key[:, :, slots],
            value[:, :, slots],
            torch.ones(1, 1, 1, len(slots), dtype=torch.bool),
            0.3,
        )
        torch.testing.assert_close(rows[:, :, row : row + 1], alone, rtol=1e-6, atol=1e-6)
