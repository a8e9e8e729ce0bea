import pytest
import torch
import torch.nn.functional as F

from heads.dflash import DFlashHead, block_attention
from heads.draft_vocab import build_draft_vocab
from heads.registry import load_head
from tests.heads.head_fixtures import LAYER_IDS, target_features, tiny_target
from train.losses import dflash_block_loss, sample_anchors

DRAFT_VOCAB = 96
BLOCK = 4


def _head(model, num_layers=2, seed=0):
    torch.manual_seed(seed)
    head = DFlashHead.from_target(
        model.config,
        embed_weight=model.model.embed_tokens.weight,
        draft_vocab=build_draft_vocab(torch.arange(128, 0, -1), DRAFT_VOCAB),
        block_size=BLOCK,
        num_layers=num_layers,
        mask_token_id=127,
        target_layer_ids=LAYER_IDS,
        lm_head_weight=model.lm_head.weight,
    )
    with torch.no_grad():  # ones in every norm would hide a swapped norm
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return head.eval()


def test_parameter_names_follow_the_speculators_layout():
    head = _head(tiny_target(), num_layers=2)
    trained = {name for name in head.state_dict() if name != "embed_tokens.weight"}
    layer = {
        *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
    }
    assert trained == {
        "fc.weight",
        "hidden_norm.weight",
        "norm.weight",
        "lm_head.weight",
        "mask_embedding",
        "d2t",
        "t2d",
        *(f"layers.{i}.{name}" for i in range(2) for name in layer),
    }
    assert head.fc.weight.shape == (64, 3 * 64)
    assert head.lm_head.weight.shape == (DRAFT_VOCAB, 64)


@torch.no_grad()
def test_a_decoded_block_is_the_trained_block_at_the_same_anchor():
    """Decoding drafts the block at anchor a from the cache filled over earlier rounds; training
    computes every anchor's block in one pass. Both must give the same logits."""
    model = tiny_target()
    head = _head(model)
    seq = 14
    input_ids = torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(3))
    attention_mask = torch.ones(1, seq, dtype=torch.long)
    features, _ = target_features(model, input_ids, attention_mask)
    anchors = torch.tensor([[1, 5, 9, 10]])
    trained = head.lm_head(head(features, attention_mask, input_ids, anchors)[:, :, 1:])  # [1, A, S-1, Vd]
    context = head.project_features(features)
    cache = head.new_cache(1, 32, "cpu", torch.float32)
    done = 0
    for i, anchor in enumerate(anchors[0].tolist()):  # context arrives in pieces, as rounds commit it
        _, logits = head.draft_block(context[:, done:anchor], input_ids[:, anchor], anchor, cache)
        done = anchor
        torch.testing.assert_close(logits, trained[:, i], rtol=1e-4, atol=1e-5)


def test_block_attention_is_dense_attention_under_the_block_mask():
    generator = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, blocks, size, context, dim = 2, 4, 2, 3, 4, 7, 8
    query = torch.randn(batch, heads, blocks * size, dim, generator=generator)
    keys, values = (
        torch.randn(batch, kv_heads, context + blocks * size, dim, generator=generator) for _ in "kv"
    )
    context_mask = torch.rand(batch, 1, blocks * size, context, generator=generator) > 0.3
    block_of = torch.arange(blocks * size) // size
    same_block = (block_of[:, None] == block_of[None, :]).expand(batch, 1, -1, -1)
    dense = F.scaled_dot_product_attention(
        query, keys, values, attn_mask=torch.cat([context_mask, same_block], dim=-1), enable_gqa=True
    )
    ours = block_attention(
        query,
        keys[:, :, :context],
        values[:, :, :context],
        keys[:, :, context:],
        values[:, :, context:],
        context_mask,
        size,
    )
    torch.testing.assert_close(ours, dense)


def test_blocks_see_neither_later_context_nor_other_blocks():
    model = tiny_target()
    head = _head(model)
    seq = 12
    input_ids = torch.randint(0, 128, (1, seq), generator=torch.Generator().manual_seed(4))
    attention_mask = torch.ones(1, seq, dtype=torch.long)
    features, _ = target_features(model, input_ids, attention_mask)
    base = head(features, attention_mask, input_ids, torch.tensor([[4, 7]]))
    changed = [f.clone() for f in features]
    for f in changed:
        f[:, 4:] += 1.0  # the anchor at 4 sees rows 0..3 only
    other = head(changed, attention_mask, input_ids, torch.tensor([[4, 9]]))
    torch.testing.assert_close(other[:, 0], base[:, 0])
    assert not torch.allclose(other[:, 1], base[:, 1])


def test_the_block_loss_trains_every_slot_and_reports_acceptance():
    model = tiny_target()
    head = _head(model).train()
    seq = 16
    input_ids = torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(5))
    attention_mask = torch.ones(2, seq, dtype=torch.long)
    loss_mask = torch.ones(2, seq, dtype=torch.long)
    loss_mask[:, :4] = 0
    features, final_hidden = target_features(model, input_ids, attention_mask)
    anchors, valid = sample_anchors(loss_mask, 6, torch.Generator().manual_seed(0))
    assert valid.all() and (anchors >= 3).all() and (anchors <= seq - 2).all()
    states = head(features, attention_mask, input_ids, anchors)
    out = dflash_block_loss(
        states,
        anchors,
        valid,
        head.lm_head.weight,
        head.draft_token_ids,
        final_hidden,
        model.lm_head.weight,
        loss_mask,
        chunk_size=5,
    )
    assert out.slot_losses.shape == (BLOCK - 1,) and (out.slot_losses > 0).all()
    assert 1 <= out.acceptance_length.item() <= BLOCK
    out.loss.backward()
    for name in ("fc.weight", "mask_embedding", "layers.1.self_attn.k_proj.weight", "lm_head.weight"):
        grad = head.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert head.embed_tokens.weight.grad is None


def test_sample_anchors_marks_rows_with_too_few_candidates():
    loss_mask = torch.zeros(1, 8, dtype=torch.long)
    loss_mask[0, 6:] = 1  # candidates: anchors 5 and 6
    anchors, valid = sample_anchors(loss_mask, 4)
    assert sorted(anchors[valid].tolist()) == [5, 6] and valid.sum() == 2


def test_save_and_load_round_trip(tmp_path):
    model = tiny_target()
    head = _head(model)
    head.save_pretrained(tmp_path)
    loaded = load_head(tmp_path, embed_weight=model.model.embed_tokens.weight, target_config=model.config)
    assert isinstance(loaded, DFlashHead) and loaded.args == head.args
    for name, tensor in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)


def test_a_head_for_another_target_is_refused(tmp_path):
    head = _head(tiny_target())
    head.save_pretrained(tmp_path)
    other = tiny_target(hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(ValueError, match="hidden_size"):
        load_head(tmp_path, embed_weight=other.model.embed_tokens.weight, target_config=other.config)
