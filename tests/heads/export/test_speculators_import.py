"""Heads written by speculators' own code (0.9.0, fixtures/speculators/, made by
make_speculators_fixture.py) import, match speculators' logits, decode exactly and export back."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

from eval.decoder import ChainDrafting, SpeculativeDecoder
from eval.policies import StaticDraftLength
from heads.export import export_head, import_head, layout_for
from heads.export.layouts import CannotExpress, TargetWeights, same_bytes
from heads.registry import trained_state
from tests.eval.drafters import greedy_reference
from tests.heads.export.export_fixtures import meta

FIXTURES = Path(__file__).parent / "fixtures" / "speculators"
VARIANTS = {
    # speculators' CLI defaults (train/config/schema.py), as its trainer builds them
    "cli_defaults": {
        "norm_before_fc": True,
        "norm_before_residual": True,
        "norm_output": True,
        "sliding_window": 2048,
    },
    "fc_norm_window": {"fc_norm": True, "sliding_window": 5},
}


@pytest.fixture(scope="module")
def verifier() -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(FIXTURES / "verifier").eval()


def imported(name: str, verifier: LlamaForCausalLM):
    return import_head(FIXTURES / name, "speculators", TargetWeights.from_model(verifier))


@pytest.mark.parametrize("name", VARIANTS)
def test_a_speculators_head_imports_with_its_variant(name, verifier):
    head = imported(name, verifier)
    assert head.args.variant.active() == VARIANTS[name]
    assert head.target_layer_ids == [0, 1, 2]  # speculators' input-of-layer ids 1..3


@pytest.mark.parametrize("name", VARIANTS)
def test_imported_heads_give_speculators_own_logits_at_every_ttt_step(name, verifier):
    """expected.safetensors holds speculators' Eagle3DraftModel logits on a fixed batch: rows
    t < T - 1 (state t with token t + 1), for each TTT step, which our unroll must reproduce."""
    head = imported(name, verifier)
    expected = load_file(FIXTURES / name / "expected.safetensors")
    input_ids, aux = expected["input_ids"], expected["aux_hidden_states"]
    steps = expected["logits"].shape[0]
    features = list(aux.chunk(3, dim=-1))
    with torch.no_grad():
        unrolled = head(features, input_ids, torch.ones_like(input_ids), num_steps=steps)
        logits = torch.stack([head.lm_head(normed)[:, :-1] for normed in unrolled.normed_states])
    torch.testing.assert_close(logits, expected["logits"], rtol=1e-4, atol=1e-4)


def test_the_window_changes_the_logits_so_the_test_above_can_fail(verifier):
    head = imported("fc_norm_window", verifier)
    expected = load_file(FIXTURES / "fc_norm_window" / "expected.safetensors")
    head.args.variant.sliding_window = None
    features = list(expected["aux_hidden_states"].chunk(3, dim=-1))
    ids = expected["input_ids"]
    with torch.no_grad():
        normed = head(features, ids, torch.ones_like(ids), num_steps=1).normed_states[0]
    assert (head.lm_head(normed)[:, :-1] - expected["logits"][0]).abs().max() > 1e-2


@pytest.mark.parametrize("name", VARIANTS)
def test_imported_heads_decode_greedy_identically(name, verifier):
    head = imported(name, verifier)
    prompts = [[5, 17, 33, 8, 9, 4], [10, 3, 56] * 3]
    decoder = SpeculativeDecoder(verifier, head, ChainDrafting(StaticDraftLength(3)), max_len=96)
    proposed = 0
    for prompt, reference in zip(prompts, greedy_reference(verifier, prompts, 40)):
        out = decoder.generate(prompt, 40)
        assert out.tokens == reference
        proposed += out.metrics.proposed_tokens
    assert proposed > 0


@pytest.mark.parametrize("name", VARIANTS)
def test_imported_heads_export_back_to_speculators_with_the_same_switches(name, verifier, tmp_path):
    head = imported(name, verifier)
    target = TargetWeights.from_model(verifier)
    out = export_head(head, layout_for("eagle3", "speculators"), tmp_path / "out", meta(), target)
    ours, theirs = (
        json.loads((out / "config.json").read_text()),
        json.loads((FIXTURES / name / "config.json").read_text()),
    )
    for key in ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output"):
        assert ours[key] == theirs[key], key
    for key in ("sliding_window", "use_sliding_window", "layer_types"):
        assert ours["transformer_layer_config"][key] == theirs["transformer_layer_config"][key], key
    again = import_head(out, "speculators", target)
    assert again.args.variant.active() == VARIANTS[name]
    first, second = trained_state(head, head.frozen_weights), trained_state(again, again.frozen_weights)
    assert first.keys() == second.keys()
    assert all(same_bytes(first[key], second[key]) for key in first)


@pytest.mark.parametrize(
    ("name", "format_name", "refused"),
    [
        ("cli_defaults", "sglang", "norm_before_fc"),
        ("cli_defaults", "vllm", "norm_output"),
        ("fc_norm_window", "vllm", "fc_norm"),
    ],
)
def test_layouts_without_the_switch_refuse_the_head_by_name(name, format_name, refused, verifier, tmp_path):
    head = imported(name, verifier)
    with pytest.raises(CannotExpress, match=refused):
        export_head(
            head,
            layout_for("eagle3", format_name),
            tmp_path / "out",
            meta(),
            TargetWeights.from_model(verifier),
        )
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()


def test_vllm_carries_norm_before_residual(verifier, tmp_path):
    head = imported("cli_defaults", verifier)
    for switch in ("norm_before_fc", "norm_output", "sliding_window"):
        setattr(head.args.variant, switch, None if switch == "sliding_window" else False)
    head.input_norm = None  # what norm_before_fc=False builds
    target = TargetWeights.from_model(verifier)
    out = export_head(head, layout_for("eagle3", "vllm"), tmp_path / "out", meta(), target)
    assert json.loads((out / "config.json").read_text())["norm_before_residual"] is True
    assert import_head(out, "vllm", target).args.variant.active() == {"norm_before_residual": True}
