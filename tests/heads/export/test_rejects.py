"""A file an engine would misread is rejected with the key named, never loaded half-random."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from heads.export import export_head, import_head, layout_for
from heads.export.validate import validate_export
from tests.heads.export.export_fixtures import make_head, meta, target_weights
from tests.heads.head_fixtures import tiny_target


@pytest.fixture
def target():
    return target_weights()


def _export(tmp_path, target, kind="eagle3", format_name="vllm", **options):
    head = make_head(kind, target, **options)
    return head, export_head(head, layout_for(kind, format_name), tmp_path / format_name, meta(), target)


def _edit_tensors(path, edit, weights_file="model.safetensors"):
    tensors = load_file(str(path / weights_file))
    edit(tensors)
    save_file(tensors, str(path / weights_file))


def _edit_config(path, edit):
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))


def _rename(old, new):
    def edit(tensors):
        tensors[new] = tensors.pop(old)

    return edit


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (
            _rename("layers.0.self_attn.q_proj.weight", "layers.0.self_attn.query.weight"),
            "layers.0.self_attn.q_proj.weight",
        ),
        (
            _rename("d2t", "draft_id_to_target_id"),
            "draft_id_to_target_id",
        ),  # vLLM's in-memory name: dropped by vLLM
        (lambda t: t.pop("norm.weight"), "norm.weight"),
        (lambda t: t.pop("d2t"), "d2t"),  # vLLM would keep a zero map
        (lambda t: t.update({"fc.weight": t["fc.weight"][:, :128].contiguous()}), "fc.weight"),
        (lambda t: t.update({"lm_head.weight": t["lm_head.weight"][:-1]}), "lm_head.weight"),
        (lambda t: t.update({"token_map": torch.arange(4)}), "token_map"),
        (lambda t: t.update({"d2t": t["d2t"].to(torch.int32)}), "d2t"),
        (
            lambda t: t.update({"norm.weight": t["norm.weight"].to(torch.float16)}),
            "float tensors must share one dtype",
        ),
    ],
)
def test_a_renamed_dropped_reshaped_or_retyped_key_is_named(tmp_path, target, edit, named):
    _, out = _export(tmp_path, target)
    _edit_tensors(out, edit)
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        import_head(out, "vllm", target)


def test_a_d2t_that_t2d_contradicts_is_rejected(tmp_path, target):
    _, out = _export(tmp_path, target, format_name="sglang")
    _edit_tensors(out, lambda t: t["t2d"].logical_not_())
    with pytest.raises(ValueError, match="'t2d' disagrees"):
        import_head(out, "sglang", target)


@pytest.mark.parametrize(
    ("format_name", "edit", "named"),
    [
        ("speculators", lambda c: c.pop("norm_before_residual"), "norm_before_residual"),  # vLLM default true
        (
            "speculators",
            lambda c: c["transformer_layer_config"].pop("model_type"),
            "model_type",
        ),  # speculators: Qwen3
        ("speculators", lambda c: c.update(draft_vocab_size=None), "draft_vocab_size"),
        ("vllm", lambda c: c.update(norm_output=True), "norm_output"),
        ("vllm", lambda c: c.update(norm_before_fc=True), "norm_before_fc"),
        ("vllm", lambda c: c.update(attention_bias=True), "attention_bias"),
        (
            "vllm",
            lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2]),
            "eagle_aux_hidden_state_layer_ids",
        ),
        (
            "vllm",
            lambda c: c.update(eagle_aux_hidden_state_layer_ids=[0, 1, 2]),
            r"vllm layer ids \[0, 1, 2\]",
        ),
        (
            "vllm",
            lambda c: c.update(
                eagle_config={"eagle_aux_hidden_state_layer_ids": c.pop("eagle_aux_hidden_state_layer_ids")}
            ),
            "sglang layout",
        ),
        ("sglang", lambda c: c.update(tie_word_embeddings=True), "tie_word_embeddings"),
        ("sglang", lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 3]), "vllm layout"),
        ("sglang", lambda c: c.update(architectures=["LlamaForCausalLM"]), "LlamaForCausalLMEagle3"),
        ("sglang", lambda c: c.update(hidden_size=None), "hidden_size"),
    ],
)
def test_a_config_the_engine_would_read_differently_is_named(tmp_path, target, format_name, edit, named):
    _, out = _export(tmp_path, target, format_name=format_name)
    _edit_config(out, edit)
    with pytest.raises(ValueError, match=named):
        import_head(out, format_name, target)


def test_medusa_without_fc_bias_would_drop_the_biases(tmp_path, target):
    """vLLM's medusa_fc_bias defaults to false: the stored biases become unexpected keys."""
    _, out = _export(tmp_path, target, kind="medusa")
    _edit_config(out, lambda c: c.pop("medusa_fc_bias"))
    with pytest.raises(ValueError, match=r"blocks\.0\.layers\.0\.bias"):
        import_head(out, "vllm", target)


def test_medusa_config_keys_are_read_as_vllm_renames_them(tmp_path, target):
    """MedusaConfig renames any top-level key with 'num' and 'layers' to num_hidden_layers."""
    _, out = _export(tmp_path, target, kind="medusa")
    _edit_config(out, lambda c: c.update(target_num_layers=4))
    with pytest.raises(ValueError, match="missing keys"):
        import_head(out, "vllm", target)


def test_the_reference_layout_refuses_distinct_resblocks(tmp_path, target):
    head = make_head("medusa", target, medusa_layers=2)
    with pytest.raises(ValueError, match="repeats one ResBlock"):
        export_head(head, layout_for("medusa", "medusa"), tmp_path / "ref", meta(), target)
    assert not (tmp_path / "ref").exists() and not (tmp_path / "ref.tmp").exists()


def test_an_embedding_copy_that_is_not_the_targets_is_refused(tmp_path, target):
    _, out = _export(tmp_path, target, format_name="speculators")
    _edit_tensors(out, lambda t: t["embed_tokens.weight"].mul_(2))
    with pytest.raises(ValueError, match="embed_tokens.weight"):
        import_head(out, "speculators", target)


def test_a_drafter_for_another_target_is_refused(tmp_path, target):
    _, out = _export(tmp_path, target)
    other = target_weights(
        tiny_target(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
    )
    with pytest.raises(ValueError, match="hidden_size"):
        import_head(out, "vllm", other)


@pytest.mark.parametrize("format_name", ["sglang", "vllm", "speculators"])
def test_validation_catches_default_weights_of_the_right_shape(tmp_path, target, format_name):
    """The silent-converter failure: a norm left at its init value passes every key check."""
    head, out = _export(tmp_path, target, format_name=format_name)
    _edit_tensors(out, lambda t: t["norm.weight"].fill_(1.0))
    with pytest.raises(ValueError, match="'norm.weight' read back from the export is not the trained tensor"):
        validate_export(out, layout_for("eagle3", format_name), head, target)


def test_validation_catches_a_head_that_only_matches_by_shape(tmp_path, target):
    head, out = _export(tmp_path, target, kind="medusa")
    other = make_head("medusa", target, seed=1)
    with pytest.raises(ValueError, match="not the trained tensor"):
        validate_export(out, layout_for("medusa", "vllm"), other, target)
