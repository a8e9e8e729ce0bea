import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from heads.draft_vocab import DraftVocab
from heads.eagle3 import Eagle3Head
from heads.medusa import MedusaHead
from heads.registry import CONFIG_FILE, WEIGHTS_FILE, build_head, load_head
from tests.heads.head_fixtures import LAYER_IDS, tiny_target


def _weights(model):
    return dict(embed_weight=model.model.embed_tokens.weight, lm_head_weight=model.lm_head.weight)


def test_build_and_load_pick_the_class_by_kind(tmp_path):
    model = tiny_target()
    eagle3 = build_head(
        "eagle3",
        model.config,
        draft_vocab=DraftVocab.full(128),
        target_layer_ids=LAYER_IDS,
        **_weights(model),
    )
    medusa = build_head("medusa", model.config, num_heads=2, num_layers=1, **_weights(model))
    eagle1 = build_head("eagle1", model.config, **_weights(model))
    for head in (eagle3, medusa, eagle1):
        head.save_pretrained(tmp_path / head.kind)
        loaded = load_head(tmp_path / head.kind, target_config=model.config, **_weights(model))
        assert type(loaded) is type(head)


def test_unknown_kind_lists_the_known_ones():
    with pytest.raises(
        ValueError, match=r"unknown head kind 'eagle9' \(known: \['dflash', 'eagle1', 'eagle3', 'medusa'\]\)"
    ):
        build_head("eagle9", None)


def test_loading_another_kind_is_refused(tmp_path):
    model = tiny_target()
    MedusaHead.from_target(
        model.config, lm_head_weight=model.lm_head.weight, num_heads=1, num_layers=1
    ).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds a 'medusa' head, not 'eagle3'"):
        Eagle3Head.from_pretrained(tmp_path, embed_weight=model.model.embed_tokens.weight)


def _saved_medusa(tmp_path):
    model = tiny_target()
    MedusaHead.from_target(
        model.config, lm_head_weight=model.lm_head.weight, num_heads=1, num_layers=1
    ).save_pretrained(tmp_path)
    return load_file(str(tmp_path / WEIGHTS_FILE))


def test_a_missing_or_renamed_key_is_named(tmp_path):
    tensors = _saved_medusa(tmp_path)
    tensors["blocks.0.layers.0.linear.weight"] = tensors.pop("blocks.0.layers.0.weight")
    save_file(tensors, str(tmp_path / WEIGHTS_FILE))
    with pytest.raises(
        ValueError,
        match=r"missing keys \['blocks.0.layers.0.weight'\], unexpected keys \['blocks.0.layers.0.linear.weight'\]",
    ):
        MedusaHead.from_pretrained(tmp_path)


def test_a_reshaped_key_is_named(tmp_path):
    tensors = _saved_medusa(tmp_path)
    tensors["lm_heads.0.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(tmp_path / WEIGHTS_FILE))
    with pytest.raises(
        ValueError, match=r"key 'lm_heads.0.weight' has shape \[3, 3\], the head expects \[128, 64\]"
    ):
        MedusaHead.from_pretrained(tmp_path)


def test_an_unknown_args_key_is_named(tmp_path):
    _saved_medusa(tmp_path)
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    config["args"]["num_hops"] = 2
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"unknown MedusaArgs keys \['num_hops'\]"):
        MedusaHead.from_pretrained(tmp_path)
