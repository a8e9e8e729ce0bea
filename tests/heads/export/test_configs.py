"""Each exported config.json carries the fields SPEC.md section 5 lists for its consumer, plus
what we record about the drafter (also said in README.md)."""

import json

import pytest
from safetensors.torch import load_file

from heads.export import export_head, layout_for
from tests.heads.export.export_fixtures import DRAFT_VOCAB, make_head, meta, target_weights
from tests.heads.head_fixtures import LAYER_IDS

LLAMA_GEOMETRY = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "max_position_embeddings",
    "hidden_act",
)


def _export(tmp_path, kind, format_name, **options):
    target = target_weights()
    head = make_head(kind, target, **options)
    out = export_head(head, layout_for(kind, format_name), tmp_path / format_name, meta(), target)
    return (
        json.loads((out / "config.json").read_text()),
        load_file(str(out / layout_for(kind, format_name).weights_file)),
        out,
    )


def test_speculators_config_carries_every_listed_field(tmp_path):
    config, tensors, _ = _export(tmp_path, "eagle3", "speculators")
    assert config["architectures"] == ["Eagle3Speculator"]
    assert config["speculators_model_type"] == "eagle3"
    assert config["speculators_version"]
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3"
    assert spec["proposal_methods"][0]["proposal_type"] == "greedy"
    assert spec["proposal_methods"][0]["speculative_tokens"] == meta().draft_length
    assert spec["default_proposal_method"] == "greedy"
    assert spec["verifier"] == {"name_or_path": "tiny-llama", "architectures": ["LlamaForCausalLM"]}
    layer = config["transformer_layer_config"]
    assert layer["model_type"] == "llama" and layer["num_hidden_layers"] == 1 and layer["vocab_size"] == 128
    assert all(key in layer for key in LLAMA_GEOMETRY)
    assert config["draft_vocab_size"] == DRAFT_VOCAB
    assert config["target_hidden_size"] == 64
    assert config["norm_before_residual"] is False  # written: vLLM's default for speculators is true
    assert config["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in LAYER_IDS]
    assert "model_type" not in config  # vLLM infers "speculators" from speculators_config
    assert {"embed_tokens.weight", "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(tensors)
    assert any(name.startswith("layers.0.") for name in tensors)


def test_sglang_config(tmp_path):
    config, tensors, _ = _export(tmp_path, "eagle3", "sglang")
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 1
    assert config["vocab_size"] == 128 and config["draft_vocab_size"] == DRAFT_VOCAB
    assert config["target_hidden_size"] == 64 and config["tie_word_embeddings"] is False
    assert config["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": LAYER_IDS,
        "use_aux_hidden_state": True,
    }
    assert all(key in config for key in LLAMA_GEOMETRY)
    assert "eagle_aux_hidden_state_layer_ids" not in config
    assert set(tensors) >= {"midlayer.hidden_norm.weight", "midlayer.self_attn.q_proj.weight", "d2t", "t2d"}
    assert tensors["midlayer.self_attn.q_proj.weight"].shape == (64, 128)  # q/k/v read 2h
    assert tensors["fc.weight"].shape == (64, 192) and tensors["lm_head.weight"].shape == (DRAFT_VOCAB, 64)
    assert "embed_tokens.weight" not in tensors


def test_vllm_eagle3_config(tmp_path):
    config, tensors, _ = _export(tmp_path, "eagle3", "vllm")
    assert config["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in LAYER_IDS]
    assert config["norm_before_residual"] is False
    assert "eagle_config" not in config  # SGLang would read its ids with the other convention
    assert not any(name.startswith("midlayer.") for name in tensors)
    assert "d2t" in tensors and "draft_id_to_target_id" not in tensors  # vLLM renames d2t itself


def test_vllm_eagle1_config(tmp_path):
    config, tensors, _ = _export(tmp_path, "eagle1", "vllm")
    assert config["architectures"] == ["EagleLlamaForCausalLM"] and config["num_hidden_layers"] == 1
    assert tensors["fc.weight"].shape == (64, 128)
    assert "layers.0.input_layernorm.weight" not in tensors
    assert not {"embed_tokens.weight", "lm_head.weight"} & set(tensors)


def test_vllm_medusa_config(tmp_path):
    config, tensors, _ = _export(tmp_path, "medusa", "vllm", medusa_layers=2)
    assert config["architectures"] == ["MedusaModel"] and config["model_type"] == "medusa"
    assert (config["num_heads"], config["num_hidden_layers"]) == (3, 2)
    assert config["truncated_vocab_size"] == config["vocab_size"] == 128
    assert config["medusa_fc_bias"] is True and config["original_lm_head"] is False
    assert [key for key in config if "num" in key] == [
        "num_heads",
        "num_hidden_layers",
    ]  # vLLM renames the rest
    assert set(tensors) >= {"blocks.2.layers.1.weight", "blocks.2.layers.1.bias", "lm_heads.2.weight"}


def test_medusa_reference_config(tmp_path):
    config, tensors, out = _export(tmp_path, "medusa", "medusa", medusa_layers=1)
    assert (config["medusa_num_heads"], config["medusa_num_layers"]) == (3, 1)
    assert config["base_model_name_or_path"] == "tiny-llama"
    assert set(tensors) == {
        f"{h}.{k}" for h in range(3) for k in ("0.linear.weight", "0.linear.bias", "1.weight")
    }
    assert (out / "medusa_lm_head.safetensors").is_file()


@pytest.mark.parametrize(
    ("kind", "format_name"), [("eagle3", "sglang"), ("eagle1", "vllm"), ("medusa", "medusa")]
)
def test_every_config_and_card_record_the_drafter(tmp_path, kind, format_name):
    config, _, out = _export(tmp_path, kind, format_name, medusa_layers=1)
    drafter = config["drafter"]
    assert drafter["target"]["name"] == "tiny-llama"
    assert drafter["target"]["tokenizer_sha256"] == "f" * 64
    assert drafter["draft_vocab_size"] == (DRAFT_VOCAB if kind == "eagle3" else 128)
    assert drafter["draft_length"] == 4
    assert drafter["verdict"]["acceptance_length"] == {"mt_bench": 2.25, "gsm8k": 2.75}
    assert drafter["gate"]["passed"] is True and drafter["gate"]["forced"] is False
    assert json.loads((out / "gate.json").read_text()) == {
        "gate": drafter["gate"],
        "verdict": drafter["verdict"],
    }
    card = (out / "README.md").read_text()
    facts = ["tiny-llama", "f" * 64, "e" * 64, "overall (bonus token included) | 2.500", "mt_bench | 2.250"]
    facts += [
        "gsm8k | 2.750",
        "K to serve with | 4",
        "break-even AL on the eval's machine (1 + alpha + beta) | 1.500",
    ]
    facts += ["drafting at eval | drafter eagle3 chain, policy static, draft_length 4, temperature 0.0"]
    facts += ["16 turns: 0 mismatches against the plain loop, 0 against HF generate", "export gate: passed"]
    assert all(fact in card for fact in facts), card


def test_an_embedded_target_is_named_by_its_hub_id_for_engines(tmp_path):
    target = target_weights()
    head = make_head("eagle3", target)
    out = export_head(
        head,
        layout_for("eagle3", "speculators"),
        tmp_path / "s",
        meta(target_name="smollm2-135m-instruct"),
        target,
    )
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert config["drafter"]["target"]["name"] == "smollm2-135m-instruct"
