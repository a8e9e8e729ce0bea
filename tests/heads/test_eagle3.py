import pytest
import torch
import torch.nn.functional as F

from heads.draft_vocab import DraftVocab, build_draft_vocab, count_masked_tokens
from heads.eagle3 import Eagle3Head, default_layer_ids, unrolled_attention
from heads.registry import CONFIG_FILE, WEIGHTS_FILE
from tests.heads.head_fixtures import LAYER_IDS, target_features, tiny_llama_config, tiny_target
from train.losses import eagle3_ttt_loss

DRAFT_VOCAB = 96


def _batch(seq=12, batch=2, seed=1):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, 128, (batch, seq), generator=generator)
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    return input_ids, attention_mask


def _head(model, draft_vocab_size=DRAFT_VOCAB, seed=0):
    torch.manual_seed(seed)
    vocab = build_draft_vocab(torch.arange(128, 0, -1), draft_vocab_size)
    head = Eagle3Head.from_target(
        model.config,
        embed_weight=model.model.embed_tokens.weight,
        draft_vocab=vocab,
        target_layer_ids=LAYER_IDS,
        lm_head_weight=model.lm_head.weight,
    )
    with torch.no_grad():  # ones in every norm would hide a swapped norm
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return head.eval()


def _slots_up_to(last_slot, max_len):
    """bool [1, 1, 1, max_len]: cache slots 0..last_slot visible."""
    return (torch.arange(max_len) <= last_slot)[None, None, None]


def test_parameter_names_follow_the_sglang_layout():
    model = tiny_target()
    head = _head(model)
    trained = {name for name in head.state_dict() if name != "embed_tokens.weight"}
    assert trained == {
        "fc.weight",
        *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
        *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        *(f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")),
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
    }
    hidden = model.config.hidden_size
    assert head.fc.weight.shape == (hidden, 3 * hidden)
    assert head.midlayer.self_attn.q_proj.weight.shape == (hidden, 2 * hidden)
    assert head.lm_head.weight.shape == (DRAFT_VOCAB, hidden)
    assert not head.embed_tokens.weight.requires_grad
    assert head.embed_tokens.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_lm_head_starts_from_the_target_rows_of_the_draft_vocab():
    model = tiny_target()
    head = _head(model)
    assert torch.equal(head.lm_head.weight, model.lm_head.weight[head.draft_token_ids])
    assert torch.equal(head.draft_token_ids, torch.arange(DRAFT_VOCAB))  # counts fall with the id


def test_forward_and_step_shapes():
    model = tiny_target()
    head = _head(model)
    input_ids, attention_mask = _batch()
    features, final_hidden = target_features(model, input_ids, attention_mask)
    unrolled = head(features, input_ids, attention_mask, num_steps=3)
    assert len(unrolled.hidden_states) == len(unrolled.normed_states) == 3
    assert all(h.shape == (2, 12, 64) for h in unrolled.hidden_states)

    cache = head.new_cache(2, 32, "cpu", torch.float32)
    assert cache[0].k.shape == (2, 2, 32, 16)
    projected = head.project_features(features, final_hidden)
    hidden, logits = head.step(
        projected[:, :5], input_ids[:, 1:6], torch.arange(5).expand(2, 5), cache, torch.arange(5),
        (torch.arange(32)[None, :] <= torch.arange(5)[:, None])[None, None],
    )  # fmt: skip
    assert hidden.shape == (2, 5, 64) and logits.shape == (2, 5, DRAFT_VOCAB)
    assert head.target_layer_ids == LAYER_IDS
    # A catch-up reads its last position's logits only; what the step writes and returns is the same.
    cache_again = head.new_cache(2, 32, "cpu", torch.float32)
    hidden_again, last_logits = head.step(
        projected[:, :5], input_ids[:, 1:6], torch.arange(5).expand(2, 5), cache_again, torch.arange(5),
        (torch.arange(32)[None, :] <= torch.arange(5)[:, None])[None, None], num_logits=1,
    )  # fmt: skip
    assert last_logits.shape == (2, 1, DRAFT_VOCAB)
    torch.testing.assert_close(last_logits, logits[:, -1:])
    torch.testing.assert_close(hidden_again, hidden)
    torch.testing.assert_close(cache_again[0].k, cache[0].k)


def test_ttt_step0_equals_cached_steps_token_by_token():
    model = tiny_target()
    head = _head(model)
    input_ids, attention_mask = _batch(seq=9)
    features, final_hidden = target_features(model, input_ids, attention_mask)
    with torch.no_grad():
        unrolled = head(features, input_ids, attention_mask, num_steps=1)
        projected = head.project_features(features, final_hidden)
        cache = head.new_cache(2, 16, "cpu", torch.float32)
        for t in range(8):
            hidden, logits = head.step(
                projected[:, t : t + 1], input_ids[:, t + 1 : t + 2], torch.full((2, 1), t), cache,
                torch.tensor([t]), _slots_up_to(t, 16),
            )  # fmt: skip
            torch.testing.assert_close(hidden[:, 0], unrolled.hidden_states[0][:, t], rtol=1e-5, atol=1e-5)
            expected_logits = head.lm_head(unrolled.normed_states[0][:, t])
            torch.testing.assert_close(logits[:, 0], expected_logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("row", [0, 3, 6])
def test_ttt_step_k_equals_drafting_a_chain_at_decode_time(row):
    """Row t of TTT step k is what decoding computes when it drafts k tokens after position t."""
    model = tiny_target()
    head = _head(model)
    input_ids, attention_mask = _batch(seq=10)
    features, final_hidden = target_features(model, input_ids, attention_mask)
    num_steps, max_len = 3, 16
    with torch.no_grad():
        unrolled = head(features, input_ids, attention_mask, num_steps=num_steps)
        projected = head.project_features(features, final_hidden)
        cache = head.new_cache(2, max_len, "cpu", torch.float32)
        prefix = row + 1  # step 0 over positions 0..row, with the target's features
        prefix_mask = (torch.arange(max_len)[None, :] <= torch.arange(prefix)[:, None])[None, None]
        hidden, _ = head.step(
            projected[:, :prefix], input_ids[:, 1 : prefix + 1], torch.arange(prefix).expand(2, prefix),
            cache, torch.arange(prefix), prefix_mask,
        )  # fmt: skip
        hidden = hidden[:, -1:]
        for step in range(1, num_steps):
            position = row + step
            hidden, _ = head.step(
                hidden, input_ids[:, position + 1 : position + 2], torch.full((2, 1), position), cache,
                torch.tensor([position]), _slots_up_to(position, max_len),
            )  # fmt: skip
            torch.testing.assert_close(
                hidden[:, 0], unrolled.hidden_states[step][:, row], rtol=1e-5, atol=1e-5
            )


def test_unrolled_attention_pattern_at_step_2_by_hand():
    """T = 4, step 2: query t reads step-0 keys 0..t (here key 2 is padding) and the step-1 and
    step-2 keys of its own row only."""
    torch.manual_seed(0)
    seq, dim = 4, 8
    query = torch.randn(1, 2, seq, dim)
    keys = [torch.randn(1, 1, seq, dim, requires_grad=True) for _ in range(3)]
    values = [torch.randn(1, 1, seq, dim) for _ in range(3)]
    step0_mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)[
        None, None
    ]
    out = unrolled_attention(query, keys, values, step0_mask)

    expected_step0 = step0_mask[0, 0]
    for t in range(seq):
        grads = torch.autograd.grad(out[0, :, t].sum(), keys, retain_graph=True)
        reads = [grad[0, 0].abs().sum(-1) > 0 for grad in grads]  # [T] per step: which keys row t read
        assert torch.equal(reads[0], expected_step0[t])
        own_row = torch.arange(seq) == t
        assert torch.equal(reads[1], own_row) and torch.equal(reads[2], own_row)

    # The same numbers as dense attention over all 3 x T keys with the hand-written mask.
    eye = torch.eye(seq, dtype=torch.bool)
    dense_mask = torch.cat([step0_mask[0, 0], eye, eye], dim=1)[None, None]
    dense = F.scaled_dot_product_attention(
        query, torch.cat(keys, 2), torch.cat(values, 2), attn_mask=dense_mask, enable_gqa=True
    )
    torch.testing.assert_close(out, dense, rtol=1e-5, atol=1e-5)


def test_cached_prefix_then_one_token_equals_the_uncached_forward():
    model = tiny_target()
    head = _head(model)
    input_ids, attention_mask = _batch(seq=8)
    features, final_hidden = target_features(model, input_ids, attention_mask)
    seq, max_len = 7, 12
    with torch.no_grad():
        projected = head.project_features(features, final_hidden)[:, :seq]
        tokens, positions = input_ids[:, 1:], torch.arange(seq).expand(2, seq)
        causal = (torch.arange(seq)[None, :] <= torch.arange(seq)[:, None])[None, None]
        full_hidden, full_logits = head.step(projected, tokens, positions, None, None, causal)

        cache = head.new_cache(2, max_len, "cpu", torch.float32)
        prefix_mask = (torch.arange(max_len)[None, :] <= torch.arange(seq - 1)[:, None])[None, None]
        head.step(
            projected[:, :-1], tokens[:, :-1], positions[:, :-1], cache, torch.arange(seq - 1), prefix_mask
        )
        last_hidden, last_logits = head.step(
            projected[:, -1:], tokens[:, -1:], positions[:, -1:], cache, torch.tensor([seq - 1]),
            _slots_up_to(seq - 1, max_len),
        )  # fmt: skip
    torch.testing.assert_close(last_hidden[:, 0], full_hidden[:, -1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last_logits[:, 0], full_logits[:, -1], rtol=1e-5, atol=1e-5)


def test_save_load_round_trip(tmp_path):
    model = tiny_target()
    head = _head(model)
    with torch.no_grad():
        head.d2t[0] = 5  # a non-trivial map must survive the trip (draft id 0 -> target id 5)
        head.t2d[0], head.t2d[5] = False, True
    head.save_pretrained(tmp_path)
    assert (tmp_path / CONFIG_FILE).is_file() and (tmp_path / WEIGHTS_FILE).is_file()

    loaded = Eagle3Head.from_pretrained(
        tmp_path, embed_weight=model.model.embed_tokens.weight, target_config=model.config
    )
    assert loaded.args == head.args
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    input_ids, attention_mask = _batch()
    features, _ = target_features(model, input_ids, attention_mask)
    with torch.no_grad():
        expected = head(features, input_ids, attention_mask, 2).normed_states[1]
        torch.testing.assert_close(loaded(features, input_ids, attention_mask, 2).normed_states[1], expected)


def test_the_target_embedding_is_not_saved(tmp_path):
    from safetensors.torch import load_file

    _head(tiny_target()).save_pretrained(tmp_path)
    assert "embed_tokens.weight" not in load_file(str(tmp_path / WEIGHTS_FILE))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"hidden_size": 32, "intermediate_size": 64}, "hidden_size"),
        ({"vocab_size": 256}, "vocab_size"),
        ({"num_hidden_layers": 2}, "target_layer_ids"),
    ],
)
def test_a_saved_head_that_does_not_fit_the_target_names_the_field(tmp_path, overrides, field):
    model = tiny_target()
    _head(model).save_pretrained(tmp_path)
    other = tiny_llama_config(**overrides)
    with pytest.raises(ValueError, match=field):
        Eagle3Head.from_pretrained(
            tmp_path, embed_weight=model.model.embed_tokens.weight, target_config=other
        )


def test_a_new_head_that_does_not_fit_the_target_names_the_field():
    model = tiny_target()
    embed = model.model.embed_tokens.weight
    vocab = DraftVocab.full(128)
    with pytest.raises(ValueError, match="target_layer_ids"):
        Eagle3Head.from_target(
            model.config, embed_weight=embed, draft_vocab=vocab, target_layer_ids=[0, 1, 4]
        )
    with pytest.raises(ValueError, match="target_layer_ids"):
        Eagle3Head.from_target(model.config, embed_weight=embed, draft_vocab=vocab, target_layer_ids=[0, 1])
    with pytest.raises(ValueError, match="embed_weight"):
        Eagle3Head.from_target(
            model.config, embed_weight=embed[:, :32], draft_vocab=vocab, target_layer_ids=LAYER_IDS
        )
    with pytest.raises(ValueError, match="vocab_size=128"):
        Eagle3Head.from_target(
            model.config, embed_weight=embed, draft_vocab=DraftVocab.full(64), target_layer_ids=LAYER_IDS
        )


def test_default_layer_ids_follow_the_internal_convention():
    assert default_layer_ids(30) == [1, 14, 26]


def test_overfits_a_fixed_batch():
    """On a tiny random target, the head learns a fixed batch: the TTT loss more than halves in 20 steps."""
    model = tiny_target(initializer_range=0.2)  # sharper target distributions than the default
    input_ids, attention_mask = _batch(seq=24, batch=2, seed=3)
    loss_mask = torch.ones_like(input_ids)
    features, final_hidden = target_features(model, input_ids, attention_mask)
    rows = zip(input_ids.tolist(), loss_mask.tolist())
    vocab = build_draft_vocab(count_masked_tokens(rows, 128), DRAFT_VOCAB)
    torch.manual_seed(0)
    head = Eagle3Head.from_target(
        model.config, embed_weight=model.model.embed_tokens.weight, draft_vocab=vocab,
        target_layer_ids=LAYER_IDS, lm_head_weight=model.lm_head.weight,
    )  # fmt: skip
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=3e-3)
    losses, accuracies = [], []
    for _ in range(20):
        unrolled = head(features, input_ids, attention_mask, num_steps=3)
        result = eagle3_ttt_loss(
            unrolled.normed_states, head.lm_head.weight, head.draft_token_ids, final_hidden,
            model.lm_head.weight, loss_mask, chunk_size=16,
        )  # fmt: skip
        optimizer.zero_grad()
        result.loss.backward()
        optimizer.step()
        losses.append(result.loss.detach())
        accuracies.append(result.step_accuracy[0])
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])
    assert accuracies[-1] > accuracies[0] + 0.2, (accuracies[0], accuracies[-1])


def test_starting_from_a_target_layer_makes_step_0_that_layer():
    """With the embedding half of q/k/v silenced, a head started from target layer 3 maps the
    output of layer 2 (the highest feature layer) to exactly the output of layer 3."""
    model = tiny_target(seed=2)
    head = _head(model)
    head.start_from_target_layer(model.model.layers[3])
    with torch.no_grad():
        for proj in (
            head.midlayer.self_attn.q_proj,
            head.midlayer.self_attn.k_proj,
            head.midlayer.self_attn.v_proj,
        ):
            proj.weight[:, : model.config.hidden_size] = 0
    input_ids, attention_mask = _batch(seq=10)
    with torch.no_grad():
        out = model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
        features = [out.hidden_states[i + 1] for i in LAYER_IDS]
        unrolled = head(features, input_ids, attention_mask, num_steps=1)
    layer_3_output = out.hidden_states[-1]  # the last layer's slot holds the final-normed state
    torch.testing.assert_close(model.model.norm(unrolled.hidden_states[0]), layer_3_output)
