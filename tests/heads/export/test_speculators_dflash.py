"""The block drafter (dflash) in the speculators layout: the fields vLLM 0.32 reads, the mask
embedding file it opens by name, and the configs it would read differently, refused by name."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from heads.export import export_head, import_head, layout_for
from heads.export.layouts import same_bytes
from heads.export.validate import validate_export
from tests.heads.export.export_fixtures import (
    DFLASH_BLOCK,
    DFLASH_LAYERS,
    DRAFT_VOCAB,
    MASK_TOKEN,
    make_head,
    meta,
    target_weights,
)
from tests.heads.head_fixtures import LAYER_IDS

LAYOUT = layout_for("dflash", "speculators")


@pytest.fixture
def target():
    return target_weights()


def _export(tmp_path, target, **options):
    head = make_head("dflash", target, **options)
    return head, export_head(head, LAYOUT, tmp_path / "dflash", meta(), target)


def _config(out):
    return json.loads((out / "config.json").read_text())


def test_the_config_carries_what_vllm_reads(tmp_path, target):
    head, out = _export(tmp_path, target)
    config = _config(out)
    assert config["architectures"] == ["DFlashSpeculator"] and config["speculators_model_type"] == "dflash"
    assert "model_type" not in config  # vLLM infers "speculators" from speculators_config
    spec = config["speculators_config"]
    assert spec["algorithm"] == "dflash" and spec["default_proposal_method"] == "greedy"
    # vLLM drafts num_speculative_tokens = speculative_tokens mask slots after the anchor, one block
    assert spec["proposal_methods"][0] == {
        "proposal_type": "greedy",
        "speculative_tokens": DFLASH_BLOCK - 1,
        "verifier_accept_k": 1,
        "accept_tolerance": 0.0,
    }
    assert spec["verifier"] == {"name_or_path": "tiny-llama", "architectures": ["LlamaForCausalLM"]}
    assert config["block_size"] == DFLASH_BLOCK and config["mask_token_id"] == MASK_TOKEN
    # vLLM's update_dflash: eagle_aux_hidden_state_layer_ids = these (input of layer j, for the
    # target), dflash_config.target_layer_ids = these - 1, which must be ours (output of layer i)
    assert config["aux_hidden_state_layer_ids"] == [i + 1 for i in LAYER_IDS]
    assert [i - 1 for i in config["aux_hidden_state_layer_ids"]] == head.target_layer_ids
    assert config["sliding_window_non_causal"] is True  # vLLM: causal = not this (absent: true)
    assert config["sample_from_anchor"] is False
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["target_hidden_size"] == 64
    layer = config["transformer_layer_config"]
    assert layer["model_type"] == "qwen3" and layer["num_hidden_layers"] == DFLASH_LAYERS
    assert (layer["hidden_size"], layer["num_attention_heads"], layer["num_key_value_heads"]) == (64, 4, 2)
    assert (layer["head_dim"], layer["vocab_size"], layer["rope_theta"]) == (16, 128, 10000.0)
    assert "layer_types" not in layer  # full attention in every draft layer
    drafter = config["drafter"]
    assert drafter["draft_length"] == DFLASH_BLOCK - 1 and drafter["draft_vocab_size"] == DRAFT_VOCAB
    assert drafter["target"]["layer_ids"] == {"ours_output_of_layer": LAYER_IDS, "speculators": [1, 2, 3]}


def test_the_weights_and_the_mask_embedding_file(tmp_path, target):
    head, out = _export(tmp_path, target)
    tensors = load_file(str(out / "model.safetensors"))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(tensors)
    assert tensors["layers.1.self_attn.q_norm.weight"].shape == (16,)
    assert tensors["fc.weight"].shape == (64, 3 * 64) and tensors["lm_head.weight"].shape == (DRAFT_VOCAB, 64)
    assert not {"embed_tokens.weight", "mask_embedding"} & set(tensors)  # vLLM shares / drops them
    saved = torch.load(out / "mask_embedding.pt", weights_only=True)
    assert saved["mask_token_id"] == MASK_TOKEN and same_bytes(saved["embedding"], head.mask_embedding)
    assert not same_bytes(saved["embedding"], target.embed_weight[MASK_TOKEN])  # learned, not the row


def test_a_full_vocabulary_head_stores_no_map(tmp_path, target):
    _, out = _export(tmp_path, target, reduced_vocab=False)
    tensors = load_file(str(out / "model.safetensors"))
    assert not {"d2t", "t2d"} & set(tensors) and tensors["lm_head.weight"].shape == (128, 64)


def test_without_the_file_vllm_embeds_the_mask_token_and_so_does_the_import(tmp_path, target):
    head, out = _export(tmp_path, target)
    (out / "mask_embedding.pt").unlink()
    assert same_bytes(import_head(out, "speculators", target).mask_embedding, target.embed_weight[MASK_TOKEN])
    with pytest.raises(
        ValueError, match="'mask_embedding' read back from the export is not the trained tensor"
    ):
        validate_export(out, LAYOUT, head, target)


def test_a_speculators_full_vocabulary_checkpoint_runs_the_targets_lm_head(tmp_path, target):
    """speculators saves no lm_head for a full vocabulary; vLLM then shares the target's."""
    _, out = _export(tmp_path, target, reduced_vocab=False)
    tensors = load_file(str(out / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(out / "model.safetensors"))
    assert same_bytes(import_head(out, "speculators", target).lm_head.weight, target.lm_head_weight)


def _set(key, value):
    return lambda config: config.update({key: value})


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (_set("sliding_window_non_causal", False), "sliding_window_non_causal"),  # vLLM: causal layers
        (_set("sample_from_anchor", True), "sample_from_anchor"),
        (_set("block_size", 8), "speculative_tokens = 3 with block_size = 8"),
        (_set("aux_hidden_state_layer_ids", [0, 1, 2]), r"speculators layer ids \[0, 1, 2\]"),
        (_set("mask_token_id", None), "mask_token_id"),
        (lambda c: c["transformer_layer_config"].update(model_type="llama"), "model_type"),
        (
            lambda c: c["transformer_layer_config"].update(layer_types=["sliding_attention"] * 2),
            "layer_types",
        ),
    ],
)
def test_a_config_vllm_would_read_differently_is_named(tmp_path, target, edit, named):
    _, out = _export(tmp_path, target)
    config = _config(out)
    edit(config)
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=named):
        import_head(out, "speculators", target)


def test_a_mask_embedding_vllm_would_drop_or_refuse_is_named(tmp_path, target):
    head, out = _export(tmp_path, target)
    tensors = load_file(str(out / "model.safetensors"))
    save_file(tensors | {"mask_embedding": head.mask_embedding.detach()}, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match="vLLM drops it there"):
        import_head(out, "speculators", target)
    save_file(tensors, str(out / "model.safetensors"))
    torch.save({"mask_token_id": 5, "embedding": head.mask_embedding.detach()}, out / "mask_embedding.pt")
    with pytest.raises(ValueError, match="mask_token_id = 5 differs"):
        import_head(out, "speculators", target)
