import pytest

from heads.eagle3 import default_layer_ids
from heads.export.layer_ids import engine_default_layer_ids, from_engine_layer_ids, to_engine_layer_ids

NUM_LAYERS = 30  # SmolLM2-135M


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("sglang", [1, 14, 26]),  # output-of-layer ids; SGLang adds 1 and captures that layer's input
        ("vllm", [2, 15, 27]),  # input-of-layer ids, used as is
        ("speculators", [2, 15, 27]),  # passed to vLLM unchanged
    ],
)
def test_internal_default_converts_to_each_engines_ids(engine, expected):
    ours = default_layer_ids(NUM_LAYERS)
    assert ours == [1, 14, 26]
    assert to_engine_layer_ids(ours, engine) == expected
    assert from_engine_layer_ids(expected, engine, NUM_LAYERS) == ours


@pytest.mark.parametrize("engine", ["sglang", "vllm", "speculators"])
def test_every_engines_default_names_our_default_layers(engine):
    """vLLM/speculators default to the INPUT of [2, n//2, n-3] = the output of [1, n//2-1, n-4]."""
    assert engine_default_layer_ids(engine, NUM_LAYERS) == default_layer_ids(NUM_LAYERS)


def test_the_vllm_embedding_slot_has_no_layer_output():
    with pytest.raises(ValueError, match=r"\[0\]"):
        from_engine_layer_ids([0, 15, 27], "vllm", NUM_LAYERS)


def test_the_vllm_final_slot_is_the_last_layers_output():
    assert from_engine_layer_ids([2, 15, NUM_LAYERS], "vllm", NUM_LAYERS) == [1, 14, NUM_LAYERS - 1]


def test_an_unknown_engine_is_named():
    with pytest.raises(ValueError, match="tgi"):
        to_engine_layer_ids([1, 2, 3], "tgi")
