"""Head + loss as one module, so accelerate (DDP, DeepSpeed, FSDP) wraps the whole step.

The losses project the head's states through its lm_head in chunks; doing that inside
this module's forward keeps every parameter access inside the wrapped forward, where
ZeRO-3 and FSDP have the weights gathered.
"""

import logging
from dataclasses import asdict, dataclass

import torch
from torch import nn

from heads.draft_vocab import DraftVocab, build_draft_vocab, count_masked_tokens
from heads.eagle1 import Eagle1Head
from heads.eagle3 import Eagle3Head
from heads.medusa import MedusaHead
from heads.target import Target
from train.config import HeadConfig, TrainConfig
from train.losses import eagle1_loss, eagle3_ttt_loss, medusa_loss

log = logging.getLogger(__name__)

EAGLE1_FEATURE_NOISE = 0.2  # half-width of the uniform noise EAGLE-1 adds to input features


@dataclass
class Features:
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T]
    hidden_states: list[torch.Tensor]  # [B, T, H] per head layer id
    final_hidden: torch.Tensor  # [B, T, H] post-norm


class Objective(nn.Module):
    """forward(features) -> (loss, metrics); metrics are device tensors, never synced here."""

    head: nn.Module

    def __init__(self, head: nn.Module, target_lm_head: torch.Tensor, chunk_tokens: int):
        super().__init__()
        self.head = head
        # The frozen target's output layer, kept out of the state dict and the optimizer.
        self._target_lm_head = [target_lm_head.detach()]
        self.chunk_tokens = chunk_tokens

    @property
    def target_lm_head(self) -> torch.Tensor:
        return self._target_lm_head[0]

    @property
    def layer_ids(self) -> list[int]:
        return self.head.target_layer_ids

    def head_args(self) -> dict:
        return asdict(self.head.args)


class Eagle3Objective(Objective):
    def __init__(self, head: Eagle3Head, target_lm_head: torch.Tensor, chunk_tokens: int, ttt_steps: int):
        super().__init__(head, target_lm_head, chunk_tokens)
        self.ttt_steps = ttt_steps

    def forward(self, feats: Features) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        unrolled = self.head(feats.hidden_states, feats.input_ids, feats.attention_mask, self.ttt_steps)
        out = eagle3_ttt_loss(
            unrolled.normed_states,
            self.head.lm_head.weight,
            self.head.draft_token_ids,
            feats.final_hidden,
            self.target_lm_head,
            feats.loss_mask,
            self.chunk_tokens,
        )
        metrics = {"loss": out.loss, "outside_mass": out.outside_mass, "argmax_coverage": out.argmax_coverage}
        for k in range(self.ttt_steps):
            metrics[f"loss_{k}"] = out.step_losses[k]
            metrics[f"acc_{k}"] = out.step_accuracy[k]
        return out.loss, metrics


class Eagle1Objective(Objective):
    def forward(self, feats: Features) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        noise = EAGLE1_FEATURE_NOISE if self.training else 0.0
        predicted = self.head(feats.final_hidden, feats.input_ids, feats.attention_mask, noise)
        out = eagle1_loss(
            predicted, self.target_lm_head, feats.final_hidden, feats.loss_mask, self.chunk_tokens
        )
        metrics = {"loss": out.loss, "feature_loss": out.feature_loss, "kl": out.kl, "acc_0": out.accuracy}
        return out.loss, metrics


class MedusaObjective(Objective):
    def forward(self, feats: Features) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        states = self.head(feats.final_hidden)
        out = medusa_loss(
            states,
            [lm_head.weight for lm_head in self.head.lm_heads],
            feats.final_hidden,
            self.target_lm_head,
            feats.loss_mask,
            self.chunk_tokens,
        )
        metrics = {"loss": out.loss}
        for i in range(len(states)):
            metrics[f"loss_{i}"] = out.head_losses[i]
            metrics[f"acc_{i}"] = out.head_accuracy[i]
        return out.loss, metrics


def draft_vocab_from_rows(train_rows, vocab_size: int, size: int) -> DraftVocab:
    """The `size` most frequent loss-masked tokens of the training rows (0 = full vocab)."""
    if size == 0 or size == vocab_size:
        return DraftVocab.full(vocab_size)
    counts = count_masked_tokens(zip(train_rows["input_ids"], train_rows["loss_mask"]), vocab_size)
    vocab = build_draft_vocab(counts, size)
    log.info(
        "draft vocab: %d of %d tokens cover %.2f%% of the training tokens",
        size,
        vocab_size,
        100 * vocab.token_coverage,
    )
    return vocab


def build_objective(head_cfg: HeadConfig, target: Target, train_rows, train_cfg: TrainConfig) -> Objective:
    """A fresh head for the target, wrapped with its training loss."""
    chunk = train_cfg.loss_chunk_tokens
    if head_cfg.kind == "eagle3":
        head = Eagle3Head.from_target(
            target.config,
            embed_weight=target.embed_weight,
            draft_vocab=draft_vocab_from_rows(train_rows, target.vocab_size, head_cfg.draft_vocab_size),
            target_layer_ids=head_cfg.layer_ids,
            lm_head_weight=target.lm_head_weight,
        )
        return Eagle3Objective(head, target.lm_head_weight, chunk, train_cfg.ttt_steps)
    if head_cfg.kind == "eagle1":
        head = Eagle1Head.from_target(
            target.config, embed_weight=target.embed_weight, lm_head_weight=target.lm_head_weight
        )
        return Eagle1Objective(head, target.lm_head_weight, chunk)
    if head_cfg.kind == "medusa":
        head = MedusaHead.from_target(
            target.config,
            lm_head_weight=target.lm_head_weight,
            num_heads=head_cfg.medusa_heads,
            num_layers=head_cfg.medusa_layers,
        )
        return MedusaObjective(head, target.lm_head_weight, chunk)
    raise ValueError(f"head.kind={head_cfg.kind!r}; choose eagle3, eagle1 or medusa")
