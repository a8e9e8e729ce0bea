import math

import pytest
import torch

from heads.blocks import causal_mask
from heads.calibration import expected_calibration_error, fit_sequential_temperatures, survival
from heads.confidence import CONFIG_FILE, WEIGHTS_FILE, ConfidenceHead
from heads.target import Target
from tests.helpers import tiny_llama, tiny_tokenizer
from train.confidence import (
    ConfidenceTraining,
    DraftChain,
    acceptance_labels,
    calibrate_on_batches,
    greedy_labels_from_acceptance,
)
from train.config import HeadConfig, TrainConfig
from train.losses import eagle3_ttt_loss
from train.objectives import Features, build_objective

B, T, H, HT, V, K = 2, 9, 6, 5, 16, 3


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors gain nothing from a second thread on a shared two-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


DRAFT_IDS = torch.tensor([0, 2, 3, 5, 7, 8, 11, 12, 15])  # a reduced draft vocabulary


def random_chain(seed: int = 0) -> tuple[DraftChain, dict]:
    generator = torch.Generator().manual_seed(seed)
    states = [torch.randn(B, T, H, generator=generator) for _ in range(K)]
    lm_heads = [torch.randn(len(DRAFT_IDS), H, generator=generator) for _ in range(K)]
    batch = {
        "input_ids": torch.randint(0, V, (B, T), generator=generator),
        "target_final_hidden": torch.randn(B, T, HT, generator=generator),
        "target_lm_head": torch.randn(V, HT, generator=generator),
        "loss_mask": torch.ones(B, T, dtype=torch.long).index_fill_(1, torch.tensor([0, 1, 5]), 0),
    }
    return DraftChain(states, states, lm_heads, DRAFT_IDS), batch


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_labels_are_the_acceptance_of_each_step_against_the_target_position_it_predicts(temperature):
    chain, batch = random_chain()
    pairs = acceptance_labels(chain, **batch, temperature=temperature, chunk_size=5)
    assert pairs.labels.shape == (K, B * (T - 2))
    for k in range(K):
        for b in range(B):
            for j in range(1, T - 1):  # target position j predicts token j + 1
                r = b * (T - 2) + j - 1
                t = j - k - 1  # the draft row of step k that predicts token j + 1
                expected_valid = t >= 0 and bool(batch["loss_mask"][b, j + 1])
                assert bool(pairs.valid[k, r]) == expected_valid
                if not expected_valid:
                    continue
                assert pairs.prev_tokens[r] == batch["input_ids"][b, j]
                target_logits = batch["target_lm_head"] @ batch["target_final_hidden"][b, j]
                draft_logits = chain.lm_heads[k] @ chain.logit_states[k][b, t]
                if temperature == 0:
                    agree = DRAFT_IDS[draft_logits.argmax()] == target_logits.argmax()
                    assert pairs.labels[k, r] == float(agree)
                    continue
                target_probs = torch.softmax(target_logits / temperature, -1)
                draft_probs = torch.zeros(V).index_copy_(
                    0, DRAFT_IDS, torch.softmax(draft_logits / temperature, -1)
                )
                total_variation = 0.5 * (target_probs - draft_probs).abs().sum()
                torch.testing.assert_close(pairs.labels[k, r], 1 - total_variation)
    assert pairs.valid.any(dim=1).all()


def test_labels_do_not_depend_on_the_chunk_size():
    chain, batch = random_chain(seed=1)
    small = acceptance_labels(chain, **batch, temperature=1.0, chunk_size=1)
    large = acceptance_labels(chain, **batch, temperature=1.0, chunk_size=1000)
    torch.testing.assert_close(small.labels, large.labels)


def test_loss_is_position_weighted_bce_that_trains_only_the_confidence_head():
    chain, batch = random_chain(seed=2)
    for states in chain.hidden_states:
        states.requires_grad_(True)
    torch.manual_seed(0)
    head = ConfidenceHead.for_drafter("eagle3", H, torch.randn(V, 4))
    torch.nn.init.normal_(head.linear.weight)
    training = ConfidenceTraining(head, gamma=2.0, temperature=1.0, chunk_size=4, l2=0.3)
    out = training(
        chain, batch["input_ids"], batch["target_final_hidden"], batch["target_lm_head"], batch["loss_mask"]
    )
    pairs = acceptance_labels(chain, **batch, temperature=1.0, chunk_size=4)
    step_losses = []
    for k in range(K):
        rows = pairs.valid[k]
        hidden = chain.hidden_states[k].reshape(-1, H)[pairs.draft_rows[k, rows]]
        logits = head(hidden, pairs.prev_tokens[rows])
        step_losses.append(
            torch.nn.functional.binary_cross_entropy_with_logits(logits, pairs.labels[k, rows])
        )
    weights = torch.exp(-torch.arange(K) / 2.0)
    penalty = 0.3 * head.linear.weight.square().sum()  # on the weights only, not the bias
    torch.testing.assert_close(out.loss, (weights * torch.stack(step_losses)).sum() / weights.sum() + penalty)
    out.loss.backward()
    assert head.linear.weight.grad.abs().sum() > 0
    assert all(states.grad is None for states in chain.hidden_states)  # the drafter is not pushed


def tiny_target() -> Target:
    return Target.from_pretrained_model(
        tiny_llama(num_layers=4, vocab_size=64, hidden_size=32, seed=3), tiny_tokenizer(64)
    )


def features(target: Target, layer_ids: list[int], seed: int = 0) -> Features:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 64, (2, 12), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    loss_mask = attention_mask.clone()
    loss_mask[:, :3] = 0
    out = target(input_ids, attention_mask, layer_ids)
    return Features(input_ids, attention_mask, loss_mask, out.hidden_states, out.final_hidden)


def test_greedy_labels_taken_from_the_ttt_loss_equal_the_computed_ones():
    chain, batch = random_chain(seed=3)
    lm_head = chain.lm_heads[0]
    shared = DraftChain(
        chain.hidden_states, chain.logit_states, [lm_head] * K, DRAFT_IDS
    )  # EAGLE-3 shares it
    out = eagle3_ttt_loss(
        shared.logit_states,
        lm_head,
        DRAFT_IDS,
        batch["target_final_hidden"],
        batch["target_lm_head"],
        batch["loss_mask"],
        chunk_size=5,
    )
    reused = greedy_labels_from_acceptance(out.accepted, out.scored, batch["input_ids"], batch["loss_mask"])
    computed = acceptance_labels(shared, **batch, temperature=0.0, chunk_size=5)
    assert torch.equal(reused.valid, computed.valid) and torch.equal(reused.labels, computed.labels)
    assert torch.equal(reused.draft_rows[reused.valid], computed.draft_rows[computed.valid])
    assert torch.equal(reused.prev_tokens, computed.prev_tokens)
    assert 0 < reused.labels.sum() < reused.valid.sum()  # both outcomes occur: the test can fail
    with pytest.raises(ValueError, match="other"):
        greedy_labels_from_acceptance(out.accepted, ~out.scored, batch["input_ids"], batch["loss_mask"])


def head_config(kind: str, **overrides) -> HeadConfig:
    return HeadConfig(kind=kind, layer_ids=[0, 1, 2], draft_vocab_size=0, medusa_heads=3, **overrides)


TRAIN = TrainConfig(ttt_steps=3, loss_chunk_tokens=7)


@pytest.mark.parametrize("kind", ["eagle3", "eagle1", "medusa"])
def test_joint_training_leaves_the_drafters_gradients_unchanged(kind):
    target = tiny_target()
    grads = {}
    for confidence in (False, True):
        torch.manual_seed(0)
        objective = build_objective(head_config(kind, confidence=confidence), target, None, TRAIN)
        feats = features(target, objective.layer_ids)
        torch.manual_seed(1)  # the same EAGLE-1 feature noise with and without the confidence head
        loss, metrics = objective(feats)
        loss.backward()
        grads[confidence] = {
            n: p.grad.clone() for n, p in objective.head.named_parameters() if p.requires_grad
        }
        if confidence:
            assert set(metrics) >= {"loss", "draft_loss", "conf_loss", "conf_label_0", "conf_pred_2"}
            torch.testing.assert_close(metrics["loss"], metrics["draft_loss"] + metrics["conf_loss"])
            assert objective.confidence.head.linear.weight.grad.abs().sum() > 0
    assert grads[True].keys() == grads[False].keys()
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, msg=name)


def test_eagle1_unroll_starts_with_the_heads_forward_and_continues_on_its_own_features():
    target = tiny_target()
    objective = build_objective(head_config("eagle1"), target, None, TRAIN)
    head, feats = objective.head, features(target, [])
    with torch.no_grad():
        states = head.unroll(feats.final_hidden, feats.input_ids, feats.attention_mask, 2)
        torch.testing.assert_close(states[0], head(feats.final_hidden, feats.input_ids, feats.attention_mask))
        # Step 1 at row t = decoding one more position after the real prefix 0..t, fed row t's own prediction.
        t = 6
        seq_features = torch.cat([feats.final_hidden[:1, : t + 1], states[0][:1, t : t + 1]], dim=1)
        tokens = feats.input_ids[:1, 1 : t + 3]  # tokens 1 .. t + 2
        positions = torch.arange(t + 2)[None]
        direct = head._predict_features(seq_features, tokens, positions, causal_mask(torch.ones(1, t + 2)))
        torch.testing.assert_close(states[1][0, t], direct[0, -1], rtol=1e-5, atol=1e-5)


def test_frozen_mode_trains_only_the_confidence_head_of_a_saved_drafter(tmp_path):
    target = tiny_target()
    torch.manual_seed(0)
    trained = build_objective(head_config("eagle3", confidence=False), target, None, TRAIN)
    trained.head.save_pretrained(tmp_path / "drafter")
    cfg = head_config("eagle3", confidence_training="frozen", confidence_drafter=str(tmp_path / "drafter"))
    objective = build_objective(cfg, target, None, TRAIN)
    trainable = {n for n, p in objective.named_parameters() if p.requires_grad}
    assert trainable == {"confidence.head.linear.weight", "confidence.head.linear.bias"}
    torch.testing.assert_close(objective.head.fc.weight, trained.head.fc.weight)
    loss, metrics = objective(features(target, objective.layer_ids))
    assert "draft_loss" not in metrics and metrics["loss"] is loss
    loss.backward()
    objective.save_pretrained(tmp_path / "out")
    assert (tmp_path / "out" / CONFIG_FILE).is_file() and (tmp_path / "out" / WEIGHTS_FILE).is_file()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"confidence_training": "later"}, "head.confidence_training='later'"),
        ({"confidence_training": "frozen"}, "needs head.confidence_drafter"),
        (
            {"confidence_training": "frozen", "confidence": False, "confidence_drafter": "x"},
            "needs head.confidence=true",
        ),
        ({"confidence_drafter": "some/dir"}, "only read when head.confidence_training=frozen"),
        ({"confidence_gamma": 0.0}, "head.confidence_gamma=0.0 must be > 0"),
        ({"confidence_temperature": -1.0}, "head.confidence_temperature=-1.0"),
        ({"confidence_l2": -0.1}, "head.confidence_l2=-0.1"),
    ],
)
def test_contradicting_confidence_settings_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_objective(head_config("eagle3", **overrides), tiny_target(), None, TRAIN)


def test_expected_calibration_error_sums_per_bin_gaps():
    predicted = torch.tensor([0.05, 0.05, 0.95, 0.55])
    outcomes = torch.tensor([0.0, 1.0, 1.0, 0.0])
    # bins: {0.05, 0.05} gap |1 - 0.1|, {0.95} gap 0.05, {0.55} gap 0.55
    assert expected_calibration_error(predicted, outcomes, num_bins=10).item() == pytest.approx(
        (0.9 + 0.05 + 0.55) / 4
    )


def test_sequential_temperature_scaling_recovers_the_temperatures_of_a_known_survival():
    generator = torch.Generator().manual_seed(0)
    rounds, true_temperatures = 20000, [2.0, 0.5, 1.5]
    logits = torch.randn(rounds, 3, generator=generator) * 2
    accepted = torch.rand(rounds, 3, generator=generator) < torch.sigmoid(
        logits / torch.tensor(true_temperatures)
    )
    outcomes = accepted.float().cumprod(dim=1)
    observed = torch.ones(rounds, 3, dtype=torch.bool)
    observed[: rounds // 4, 2] = False  # some rounds drafted only two tokens
    fitted = fit_sequential_temperatures(logits, outcomes, observed)
    for got, expected in zip(fitted, true_temperatures):
        assert got == pytest.approx(expected, rel=0.2)
    after, before = survival(logits, fitted), survival(logits)
    for j in range(3):
        rows = observed[:, j]
        ece_after = expected_calibration_error(after[rows, j], outcomes[rows, j]).item()
        assert ece_after < 0.015
        assert ece_after < expected_calibration_error(before[rows, j], outcomes[rows, j]).item()


def test_calibration_on_held_out_batches_sets_the_heads_temperatures():
    target = tiny_target()
    torch.manual_seed(0)
    objective = build_objective(head_config("eagle3"), target, None, TRAIN)
    batches = [features(target, objective.layer_ids, seed) for seed in range(3)]
    fit = calibrate_on_batches(objective, batches)
    assert len(fit.temperatures) == TRAIN.ttt_steps
    assert objective.confidence.head.args.temperatures == fit.temperatures
    assert fit.ece_after[0] <= fit.ece_before[0]  # T = 1 is on the grid
    assert all(count > 0 for count in fit.rounds) and objective.training
    assert not any(math.isnan(e) for e in fit.ece_after)


def test_a_fit_logs_rounded_and_explains_a_clamped_temperature():
    from heads.calibration import TEMPERATURE_GRID, CalibrationFit

    top = float(TEMPERATURE_GRID[-1])
    line = str(CalibrationFit([1.1329469723303542, top], [0.1, 0.3], [0.05, 0.3], [100, 3]))
    assert line.startswith("T by draft position 1.13, 20.00 (chains 100, 3; ECE 0.100->0.050, 0.300->0.300)")
    assert "T=20 is the grid's top (clamped)" in line and "1.1329" not in line
    assert "clamped" not in str(CalibrationFit([1.0], [0.1], [0.1], [10]))
