import json

import pytest
import torch
from safetensors.torch import load_file

from heads.confidence import CONFIG_FILE, WEIGHTS_FILE, ConfidenceHead, has_confidence, load_confidence

VOCAB, EMBED, HIDDEN = 32, 8, 12


@pytest.fixture
def embed_weight():
    return torch.randn(VOCAB, EMBED, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def head(embed_weight):
    torch.manual_seed(0)
    head = ConfidenceHead.for_drafter("eagle3", HIDDEN, embed_weight, label_temperature=0.0)
    torch.nn.init.normal_(head.linear.weight)  # a trained head's, not the zeros it starts from
    torch.nn.init.normal_(head.linear.bias)
    return head


def test_a_fresh_head_starts_at_one_half_everywhere(embed_weight):
    fresh = ConfidenceHead.for_drafter("eagle3", HIDDEN, embed_weight)
    logits = fresh(torch.randn(3, HIDDEN), torch.randint(0, VOCAB, (3,)))
    assert torch.equal(logits, torch.zeros(3))  # no random spread for calibration to undo


def test_logits_are_one_linear_layer_on_normalised_state_and_previous_embedding(head, embed_weight):
    hidden = torch.randn(2, 5, HIDDEN)
    tokens = torch.randint(0, VOCAB, (2, 5))
    logits = head(hidden, tokens)
    assert logits.shape == (2, 5) and logits.dtype == torch.float32

    def rms(x):
        return x / x.square().mean(-1, keepdim=True).add(1e-6).sqrt()

    features = torch.cat([rms(hidden), rms(embed_weight[tokens])], dim=-1)
    expected = features @ head.linear.weight[0] + head.linear.bias[0]
    torch.testing.assert_close(logits, expected)
    # Scale-free in the state (EAGLE-3's pre-norm state grows along the unroll).
    torch.testing.assert_close(head(hidden * 7.0, tokens), logits)


def test_calibration_divides_each_positions_logit_by_its_temperature(head):
    logits = torch.tensor([0.8, -1.2])
    torch.testing.assert_close(head.probability(logits, 0), logits.sigmoid())  # unfitted: T = 1
    head.set_temperatures([2.0, 0.5])
    torch.testing.assert_close(head.probability(logits, 0), (logits / 2.0).sigmoid())
    torch.testing.assert_close(head.probability(logits, 1), (logits / 0.5).sigmoid())
    # Past the fitted positions: the last temperature.
    torch.testing.assert_close(head.probability(logits, 6), (logits / 0.5).sigmoid())
    with pytest.raises(ValueError, match=r"\[0.0\] are not positive finite temperatures"):
        head.set_temperatures([1.0, 0.0])


def test_save_and_load_round_trip_beside_a_head_without_the_embedding(head, embed_weight, tmp_path):
    head.set_temperatures([1.5, 0.7, 0.9])
    (tmp_path / "model.safetensors").write_bytes(b"drafter weights stay untouched")
    head.save_pretrained(tmp_path)
    assert set(load_file(tmp_path / WEIGHTS_FILE)) == {"linear.weight", "linear.bias"}
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert config["args"]["temperatures"] == [1.5, 0.7, 0.9]
    assert config["args"]["drafter_kind"] == "eagle3"
    assert (tmp_path / "model.safetensors").read_bytes() == b"drafter weights stay untouched"

    loaded = load_confidence(tmp_path, embed_weight=embed_weight)
    hidden, tokens = torch.randn(3, HIDDEN), torch.tensor([1, 2, 3])
    torch.testing.assert_close(loaded(hidden, tokens), head(hidden, tokens))
    assert loaded.args == head.args
    assert loaded.embed_tokens.weight.data_ptr() == embed_weight.data_ptr()  # the target's storage


def test_a_directory_without_confidence_files_loads_none_and_bad_files_are_named(
    head, embed_weight, tmp_path
):
    assert not has_confidence(tmp_path)
    assert load_confidence(tmp_path, embed_weight=embed_weight) is None
    with pytest.raises(ValueError, match="confidence_config.json: not found"):
        ConfidenceHead.from_pretrained(tmp_path, embed_weight=embed_weight)
    head.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"embed_weight has shape \[32, 4\]"):
        ConfidenceHead.from_pretrained(tmp_path, embed_weight=torch.zeros(VOCAB, 4))
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    config["args"]["hidden_size"] = HIDDEN + 1
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(ValueError, match="confidence.safetensors: key 'linear.weight' has shape"):
        ConfidenceHead.from_pretrained(tmp_path, embed_weight=embed_weight)
    config["args"]["colour"] = "red"
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"unknown ConfidenceArgs keys \['colour'\]"):
        ConfidenceHead.from_pretrained(tmp_path, embed_weight=embed_weight)
