"""Training and calibrating the confidence head (SPEC.md section 4; heads/confidence.py).

Labels. Draft step k at row t predicts the token at t + k + 2 (train/losses.py's alignment for
TTT steps, EAGLE-1 unroll steps and Medusa heads alike). Its label is the acceptance the
verifier would give it, conditioned on the earlier drafts being accepted, i.e. on the context
being the data's own tokens: the soft acceptance Σ_v min(target_probs, draft_probs) =
1 - ½‖target_probs - draft_probs‖₁ at the configured decode temperature, with the draft
distribution zero outside the draft vocabulary and the target's over the full vocabulary; at
temperature 0, whether the draft argmax is the target argmax. Steps k >= 1 come from the
training-time-test unroll, so their states are built on the drafter's own earlier outputs, as
at decode time. Labels are computed in chunks of target rows (one chunk x vocab block of
logits at a time) and carry no gradient; at temperature 0 an EAGLE-3 objective hands over the
ones its TTT loss already computed (the same pairs: `greedy_labels_from_acceptance`).

Loss. BCE against the labels, mean over the rows of each step, steps weighted exp(-k/γ) and
normalised by the weights' sum, plus l2·‖w‖² on the head's weights (not its bias). The
confidence head reads DETACHED drafter states: trained jointly, its loss leaves the drafter's
gradients exactly as without it (the drafter is never asked to make its states predict its own
acceptance, which could trade acceptance for predictability); trained on a frozen drafter, only
its own two tensors train. Its labels are then best taken on conversations the drafter did not
train on (conf/train/confidence.yaml): on its own training rows a drafter accepts more.

Calibration. Sequential temperature scaling: position by position, left to right, the
temperature minimising the ECE of the cumulative survival a_j = Π_{i<=j} c_i, with the earlier
positions' temperatures already fitted. On the training data's held-out split (the proxy:
survival realised = product of labels) here; eval/calibration.py fits the same way on real
decoding rounds.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from heads.calibration import CalibrationFit, fit_calibration
from heads.confidence import ConfidenceHead

if TYPE_CHECKING:
    from train.objectives import Features, Objective


@dataclass
class DraftChain:
    """A drafter's K steps over a batch; row t of step k predicts the token at t + k + 2."""

    hidden_states: list[torch.Tensor]  # K x [B, T, H]: what the confidence head reads (decode's `hidden`)
    logit_states: list[torch.Tensor]  # K x [B, T, H]: what the step's lm_head reads
    lm_heads: list[torch.Tensor]  # K x [Vd, H]
    draft_token_ids: torch.Tensor | None  # int64 [Vd] target id per draft id; None = full vocab


@dataclass
class PairedLabels:
    """Draft step k paired with target row r = (b, j), j = 1 .. T - 2 (position j predicts token j + 1)."""

    labels: torch.Tensor  # float32 [K, N], N = B * (T - 2); 0 where not valid
    valid: torch.Tensor  # bool [K, N]
    draft_rows: torch.Tensor  # int64 [K, N]: row b * T + (j - k - 1) of step k's [B * T] states
    prev_tokens: torch.Tensor  # int64 [N]: token j, the one step k consumed there (any k)


def pair_rows(loss_mask: torch.Tensor, num_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """loss_mask [B, T] -> (draft_rows int64 [K, N], valid bool [K, N]); see PairedLabels."""
    batch, seq_len = loss_mask.shape
    device = loss_mask.device
    step = torch.arange(num_steps, device=device)[:, None, None]  # [K, 1, 1]
    sample = torch.arange(batch, device=device)[None, :, None]  # [1, B, 1]
    position = torch.arange(1, max(seq_len - 1, 1), device=device)[None, None, :]  # [1, 1, T - 2]
    draft_t = position - step - 1
    draft_rows = (sample * seq_len + draft_t.clamp_min(0)).expand(num_steps, batch, -1)  # [K, B, T - 2]
    valid = (draft_t >= 0) & loss_mask.bool()[None, :, 2:]  # the predicted token j + 1 is a loss token
    return draft_rows.reshape(num_steps, -1), valid.reshape(num_steps, -1)


@torch.no_grad()
def acceptance_labels(
    chain: DraftChain,
    input_ids: torch.Tensor,
    target_final_hidden: torch.Tensor,
    target_lm_head: torch.Tensor,
    loss_mask: torch.Tensor,
    temperature: float,
    chunk_size: int,
) -> PairedLabels:
    """Soft (temperature > 0) or greedy (0) acceptance labels of every valid (step, row) pair.

    input_ids, loss_mask [B, T]; target_final_hidden [B, T, Ht]; target_lm_head [V, Ht]. Each
    chunk of target rows is projected once over the full vocabulary and reused by all K steps.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1")
    if temperature < 0:
        raise ValueError(f"confidence label temperature={temperature} must be >= 0")
    num_steps = len(chain.logit_states)
    batch, seq_len = loss_mask.shape
    draft_rows, valid = pair_rows(loss_mask, num_steps)
    target_hidden = target_final_hidden[:, 1 : seq_len - 1].reshape(
        -1, target_final_hidden.shape[-1]
    )  # [N, Ht]
    states = [s.detach().reshape(batch * seq_len, -1) for s in chain.logit_states]  # K x [B * T, H]
    draft_ids = chain.draft_token_ids
    scale = 1.0 if temperature == 0 else 1.0 / temperature
    labels = torch.zeros(valid.shape, dtype=torch.float32, device=loss_mask.device)
    for start in range(0, target_hidden.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        target_logits = (target_hidden[rows] @ target_lm_head.T).float()  # [n, V]
        if temperature == 0:
            target_argmax = target_logits.argmax(-1)  # [n]
        else:
            target_probs = torch.softmax(target_logits * scale, dim=-1)
            if draft_ids is not None:
                target_probs = target_probs.index_select(1, draft_ids)  # [n, Vd]: draft_probs is 0 elsewhere
        del target_logits
        for step in range(num_steps):
            draft_hidden = states[step].index_select(0, draft_rows[step, rows])  # [n, H]
            draft_logits = (draft_hidden @ chain.lm_heads[step].T).float()  # [n, Vd]
            if temperature == 0:
                draft_argmax = draft_logits.argmax(-1)
                if draft_ids is not None:
                    draft_argmax = draft_ids[draft_argmax]
                labels[step, rows] = (draft_argmax == target_argmax).float()
            else:
                draft_probs = torch.softmax(draft_logits * scale, dim=-1)
                labels[step, rows] = torch.minimum(draft_probs, target_probs).sum(-1)
    prev_tokens = input_ids[:, 1 : seq_len - 1].reshape(-1)
    return PairedLabels(torch.where(valid, labels, 0), valid, draft_rows, prev_tokens)


def greedy_labels_from_acceptance(
    accepted: torch.Tensor, scored: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor
) -> PairedLabels:
    """The temperature-0 labels from a loss that already compared each step's draft argmax with
    the target's over the same (step, row) pairs (train/losses.py `TTTLoss.accepted` / `scored`,
    whose row layout is PairedLabels'): no second projection over the vocabulary."""
    draft_rows, valid = pair_rows(loss_mask, accepted.shape[0])
    if not torch.equal(valid, scored):
        raise ValueError("the loss scored other (step, row) pairs than the confidence labels pair")
    seq_len = loss_mask.shape[1]
    return PairedLabels(accepted.float(), valid, draft_rows, input_ids[:, 1 : seq_len - 1].reshape(-1))


@dataclass
class ConfidenceLoss:
    loss: torch.Tensor  # scalar Σ_k w_k step_losses[k] / Σ_k w_k + l2 ‖weight‖², w_k = exp(-k / γ)
    step_losses: torch.Tensor  # [K] mean BCE per step
    step_labels: torch.Tensor  # [K] mean label (the acceptance the drafter reaches at step k)
    step_predictions: torch.Tensor  # [K] mean predicted c_k (uncalibrated)

    def metrics(self) -> dict[str, torch.Tensor]:
        out = {"conf_loss": self.loss}
        for k in range(self.step_losses.numel()):
            out[f"conf_label_{k}"] = self.step_labels[k]
            out[f"conf_pred_{k}"] = self.step_predictions[k]
        return out


@dataclass
class ConfidencePredictions:
    logits: torch.Tensor  # float32 [K, N] uncalibrated confidence logits
    pairs: PairedLabels


class ConfidenceTraining(nn.Module):
    """The confidence head plus its label settings; an Objective holds one and adds its loss."""

    def __init__(
        self, head: ConfidenceHead, gamma: float, temperature: float, chunk_size: int, l2: float = 0.0
    ):
        super().__init__()
        if gamma <= 0:
            raise ValueError(f"head.confidence_gamma={gamma} must be > 0")
        self.head = head
        self.gamma = gamma
        self.l2 = l2
        self.temperature = temperature
        self.chunk_size = chunk_size

    def predict(
        self,
        chain: DraftChain,
        input_ids: torch.Tensor,
        target_final_hidden: torch.Tensor,
        target_lm_head: torch.Tensor,
        loss_mask: torch.Tensor,
        pairs: PairedLabels | None = None,
    ) -> ConfidencePredictions:
        """pairs: labels the caller already has (greedy_labels_from_acceptance); else computed."""
        if pairs is None:
            pairs = acceptance_labels(
                chain,
                input_ids,
                target_final_hidden,
                target_lm_head,
                loss_mask,
                self.temperature,
                self.chunk_size,
            )
        logits = []
        for step, states in enumerate(chain.hidden_states):
            flat = states.detach().reshape(-1, states.shape[-1])  # [B * T, H]
            logits.append(self.head(flat.index_select(0, pairs.draft_rows[step]), pairs.prev_tokens))
        return ConfidencePredictions(torch.stack(logits), pairs)  # [K, N]

    def forward(
        self,
        chain: DraftChain,
        input_ids: torch.Tensor,
        target_final_hidden: torch.Tensor,
        target_lm_head: torch.Tensor,
        loss_mask: torch.Tensor,
        pairs: PairedLabels | None = None,
    ) -> ConfidenceLoss:
        predicted = self.predict(chain, input_ids, target_final_hidden, target_lm_head, loss_mask, pairs)
        pairs = predicted.pairs
        counts = pairs.valid.sum(-1).clamp(min=1)  # [K]
        bce = F.binary_cross_entropy_with_logits(predicted.logits, pairs.labels, reduction="none")
        step_losses = torch.where(pairs.valid, bce, 0).sum(-1) / counts
        steps = torch.arange(len(chain.hidden_states), dtype=torch.float32, device=step_losses.device)
        weights = torch.exp(-steps / self.gamma)
        penalty = self.l2 * self.head.linear.weight.float().square().sum()
        return ConfidenceLoss(
            loss=(weights * step_losses).sum() / weights.sum() + penalty,
            step_losses=step_losses,
            step_labels=pairs.labels.sum(-1) / counts,
            step_predictions=torch.where(pairs.valid, predicted.logits.sigmoid(), 0).sum(-1) / counts,
        )


def chains_from_pairs(
    values: torch.Tensor, pairs: PairedLabels, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-index [K, N] pair values into draft chains: chain = the draft rooted at state row
    b * T + t, position k = step k. -> (values [num_rows, K], valid [num_rows, K])."""
    num_steps = values.shape[0]
    chain_values = values.new_zeros(num_rows, num_steps)
    chain_valid = torch.zeros(num_rows, num_steps, dtype=torch.float32, device=values.device)
    for step in range(num_steps):
        rows, valid = pairs.draft_rows[step], pairs.valid[step]
        chain_values[:, step].index_add_(0, rows, torch.where(valid, values[step], 0))
        chain_valid[:, step].index_add_(0, rows, valid.float())
    return chain_values, chain_valid > 0


@torch.no_grad()
def calibrate_on_batches(objective: "Objective", batches: Iterable["Features"]) -> CalibrationFit:
    """Fit the objective's confidence temperatures on held-out batches (the training proxy:
    realised survival = Π labels, on the data's own tokens) and store them in its head."""
    if objective.confidence is None:
        raise ValueError("the objective has no confidence head (head.confidence=false)")
    was_training = objective.training
    objective.eval()
    logits, outcomes, observed = [], [], []
    for feats in batches:
        predicted = objective.confidence.predict(
            objective.draft_chain(feats),
            feats.input_ids,
            feats.final_hidden,
            objective.target_lm_head,
            feats.loss_mask,
        )
        num_rows = feats.input_ids.numel()
        chain_logits, valid = chains_from_pairs(predicted.logits, predicted.pairs, num_rows)
        chain_labels, _ = chains_from_pairs(predicted.pairs.labels, predicted.pairs, num_rows)
        valid = valid.cumprod(dim=-1).bool()  # a chain is observed up to its first unscored step
        keep = valid[:, 0]
        logits.append(chain_logits[keep])
        outcomes.append(chain_labels[keep].cumprod(dim=-1))
        observed.append(valid[keep])
    objective.train(was_training)
    if not logits:
        raise ValueError("calibration needs at least one held-out batch")
    fit = fit_calibration(torch.cat(logits), torch.cat(outcomes), torch.cat(observed))
    objective.confidence.head.set_temperatures(fit.temperatures)
    return fit
