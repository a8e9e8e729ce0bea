"""Export -> import -> export for every format: byte-identical tensors, same config."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from heads.export import LAYOUTS, export_head, import_head, layout_for
from heads.export.layouts import same_bytes
from heads.registry import trained_state
from tests.heads.export.export_fixtures import make_head, meta, share_medusa_layers, target_weights

CASES = [
    ("eagle3", "sglang", dict(reduced_vocab=True)),
    ("eagle3", "sglang", dict(reduced_vocab=False)),
    ("eagle3", "vllm", dict(reduced_vocab=True)),
    ("eagle3", "vllm", dict(reduced_vocab=False)),
    ("eagle3", "speculators", dict(reduced_vocab=True)),
    ("eagle3", "speculators", dict(reduced_vocab=False)),
    ("dflash", "speculators", dict(reduced_vocab=True)),
    ("dflash", "speculators", dict(reduced_vocab=False)),
    ("eagle1", "vllm", {}),
    ("medusa", "vllm", dict(medusa_layers=2)),
    ("medusa", "medusa", dict(medusa_layers=1)),
    ("medusa", "medusa", dict(medusa_layers=2)),  # shared ResBlocks, as the reference code has them
]


def test_every_layout_has_a_round_trip_case():
    assert {(kind, name) for kind, name, _ in CASES} == set(LAYOUTS)


@pytest.mark.parametrize(("kind", "format_name", "options"), CASES)
def test_import_then_export_round_trips_byte_identical_tensors(tmp_path, kind, format_name, options):
    target = target_weights()
    head = make_head(kind, target, **options)
    if format_name == "medusa":
        share_medusa_layers(head)
    layout = layout_for(kind, format_name)
    first = export_head(head, layout, tmp_path / "first", meta(), target)

    imported = import_head(first, format_name, target)
    ours, theirs = trained_state(head, head.frozen_weights), trained_state(imported, imported.frozen_weights)
    assert set(ours) == set(theirs)
    assert all(same_bytes(ours[name], theirs[name]) for name in ours)
    assert imported.target_layer_ids == head.target_layer_ids

    second = export_head(imported, layout, tmp_path / "second", meta(), target)
    first_tensors = load_file(str(first / layout.weights_file))
    second_tensors = load_file(str(second / layout.weights_file))
    assert set(first_tensors) == set(second_tensors)
    for name, tensor in first_tensors.items():
        assert same_bytes(tensor, second_tensors[name]), name
    assert json.loads((first / "config.json").read_text()) == json.loads((second / "config.json").read_text())


def test_a_bf16_head_round_trips_in_bf16(tmp_path):
    target = target_weights()
    head = make_head("eagle3", target).to(torch.bfloat16)
    layout = layout_for("eagle3", "sglang")
    out = export_head(head, layout, tmp_path / "bf16", meta(), target)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    imported = import_head(out, "sglang", target)
    assert imported.fc.weight.dtype == torch.bfloat16
    assert same_bytes(imported.fc.weight, head.fc.weight)


def test_a_full_vocabulary_head_stores_no_map_for_vllm(tmp_path):
    """vLLM 0.33 has no draft_id_to_target_id when draft vocab == target vocab and rejects a d2t."""
    target = target_weights()
    head = make_head("eagle3", target, reduced_vocab=False)
    out = export_head(head, layout_for("eagle3", "vllm"), tmp_path / "full", meta(), target)
    assert not {"d2t", "t2d"} & set(load_file(str(out / "model.safetensors")))


def test_vllm_reads_the_legacy_midlayer_prefix(tmp_path):
    """vLLM's loader maps `midlayer.` to `layers.0.`, so an SGLang-named file imports as vllm too."""
    target = target_weights()
    head = make_head("eagle3", target)
    out = export_head(head, layout_for("eagle3", "vllm"), tmp_path / "vllm", meta(), target)
    tensors = load_file(str(out / "model.safetensors"))
    renamed = {name.replace("layers.0.", "midlayer."): t for name, t in tensors.items()}
    save_file(renamed, str(out / "model.safetensors"))
    imported = import_head(out, "vllm", target)
    assert same_bytes(imported.midlayer.hidden_norm.weight, head.midlayer.hidden_norm.weight)


def test_a_bias_free_vllm_medusa_imports_with_zero_biases(tmp_path):
    """vLLM's default medusa_fc_bias=false: ResBlocks without bias are ours with a zero bias."""
    target = target_weights()
    head = make_head("medusa", target)
    out = export_head(head, layout_for("medusa", "vllm"), tmp_path / "medusa", meta(), target)
    tensors = {
        name: t for name, t in load_file(str(out / "model.safetensors")).items() if not name.endswith("bias")
    }
    save_file(tensors, str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    config["medusa_fc_bias"] = False
    (out / "config.json").write_text(json.dumps(config))
    imported = import_head(out, "vllm", target)
    assert not imported.blocks[0].layers[0].bias.any()
    assert same_bytes(imported.blocks[2].layers[1].weight, head.blocks[2].layers[1].weight)
