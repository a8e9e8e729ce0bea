"""Head + loss as one module, so accelerate (DDP, DeepSpeed, FSDP) wraps the whole step.

The losses project the head's states through its lm_head in chunks; doing that inside
this module's forward keeps every parameter access inside the wrapped forward, where
ZeRO-3 and FSDP have the weights gathered.

With `head.confidence`, the objective also trains a confidence head (train/confidence.py) on
the drafter's detached states: jointly (its loss added to the drafter's), or alone on a frozen,
already trained drafter (`head.confidence_training=frozen`). `metrics["loss"]` is always the
loss being optimised; the drafter's own is then `draft_loss`.
"""

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from heads.confidence import ConfidenceHead, has_confidence
from heads.dflash import DFlashHead
from heads.draft_vocab import DraftVocab, build_draft_vocab, count_masked_tokens
from heads.eagle1 import Eagle1Head
from heads.eagle3 import Eagle3Head, UnrolledSteps
from heads.medusa import MedusaHead
from heads.registry import RELEASE_DIR, load_head, read_head_config
from heads.target import Target
from train.confidence import (
    ConfidenceTraining,
    DraftChain,
    PairedLabels,
    greedy_labels_from_acceptance,
)
from train.config import HeadConfig, TrainConfig
from train.losses import dflash_block_loss, eagle1_loss, eagle3_ttt_loss, medusa_loss, sample_anchors

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

    def __init__(
        self,
        head: nn.Module,
        target_lm_head: torch.Tensor,
        chunk_tokens: int,
        confidence: ConfidenceTraining | None = None,
        train_drafter: bool = True,
    ):
        """confidence: train a confidence head too; train_drafter False: the drafter is frozen
        (its parameters stop requiring grad) and only the confidence head trains."""
        super().__init__()
        if not train_drafter and confidence is None:
            raise ValueError("a frozen drafter leaves nothing to train without a confidence head")
        self.head = head
        self.confidence = confidence
        self.train_drafter = train_drafter
        if not train_drafter:
            head.requires_grad_(False)
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

    def draft_chain(self, feats: Features) -> DraftChain:
        """The drafter's K draft steps over a batch, without gradients (confidence calibration)."""
        raise NotImplementedError

    def save_pretrained(self, path) -> None:
        """The head, and beside it the confidence head when there is one."""
        self.head.save_pretrained(path)
        if self.confidence is not None:
            self.confidence.head.save_pretrained(path)

    def _finish(
        self,
        feats: Features,
        chain: DraftChain,
        draft_loss: torch.Tensor | None,
        metrics: dict,
        pairs: PairedLabels | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Add the confidence loss (if any) to the drafter's (None when frozen); pairs: its
        labels when the drafter's loss already computed them."""
        if self.confidence is None:
            return draft_loss, metrics
        out = self.confidence(
            chain, feats.input_ids, feats.final_hidden, self.target_lm_head, feats.loss_mask, pairs
        )
        loss = out.loss if draft_loss is None else draft_loss + out.loss
        if draft_loss is not None:
            metrics["draft_loss"] = draft_loss
        return loss, metrics | out.metrics() | {"loss": loss}


class Eagle3Objective(Objective):
    def __init__(
        self, head: Eagle3Head, target_lm_head: torch.Tensor, chunk_tokens: int, ttt_steps: int, **kw
    ):
        super().__init__(head, target_lm_head, chunk_tokens, **kw)
        self.ttt_steps = ttt_steps

    def _unroll(self, feats: Features) -> UnrolledSteps:
        return self.head(feats.hidden_states, feats.input_ids, feats.attention_mask, self.ttt_steps)

    def _chain(self, unrolled: UnrolledSteps) -> DraftChain:
        steps = len(unrolled.hidden_states)
        return DraftChain(
            unrolled.hidden_states,
            unrolled.normed_states,
            [self.head.lm_head.weight] * steps,
            self.head.draft_token_ids,
        )

    @torch.no_grad()
    def draft_chain(self, feats: Features) -> DraftChain:
        return self._chain(self._unroll(feats))

    def forward(self, feats: Features) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if not self.train_drafter:
            return self._finish(feats, self.draft_chain(feats), None, {})
        unrolled = self._unroll(feats)
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
        pairs = None
        if self.confidence is not None and self.confidence.temperature == 0:
            pairs = greedy_labels_from_acceptance(out.accepted, out.scored, feats.input_ids, feats.loss_mask)
        return self._finish(feats, self._chain(unrolled), out.loss, metrics, pairs)


class Eagle1Objective(Objective):
    def __init__(
        self, head: Eagle1Head, target_lm_head: torch.Tensor, chunk_tokens: int, confidence_steps: int, **kw
    ):
        """confidence_steps: depth of the unroll the confidence head learns from (EAGLE-1's own
        loss trains one step)."""
        super().__init__(head, target_lm_head, chunk_tokens, **kw)
        self.confidence_steps = confidence_steps

    @torch.no_grad()
    def draft_chain(self, feats: Features) -> DraftChain:
        states = self.head.unroll(
            feats.final_hidden, feats.input_ids, feats.attention_mask, self.confidence_steps
        )
        return DraftChain(states, states, [self.head.lm_head.weight] * len(states), None)

    def forward(self, feats: Features) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        chain = self.draft_chain(feats) if self.confidence is not None else None
        if not self.train_drafter:
            return self._finish(feats, chain, None, {})
        noise = EAGLE1_FEATURE_NOISE if self.training else 0.0
        predicted = self.head(feats.final_hidden, feats.input_ids, feats.attention_mask, noise)
        out = eagle1_loss(
            predicted, self.target_lm_head, feats.final_hidden, feats.loss_mask, self.chunk_tokens
        )
        metrics = {"loss": out.loss, "feature_loss": out.feature_loss, "kl": out.kl, "acc_0": out.accuracy}
        return self._finish(feats, chain, out.loss, metrics)


class MedusaObjective(Objective):
    def _chain(self, states: list[torch.Tensor]) -> DraftChain:
        return DraftChain(states, states, [lm_head.weight for lm_head in self.head.lm_heads], None)

    @torch.no_grad()
    def draft_chain(self, feats: Features) -> DraftChain:
        return self._chain(self.head(feats.final_hidden))

    def forward(self, feats: Features) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if not self.train_drafter:
            return self._finish(feats, self.draft_chain(feats), None, {})
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
        return self._finish(feats, self._chain(states), out.loss, metrics)


class DFlashObjective(Objective):
    def __init__(
        self,
        head: DFlashHead,
        target_lm_head: torch.Tensor,
        chunk_tokens: int,
        max_anchors: int,
        gamma: float,
    ):
        """max_anchors: blocks per row (anchors sampled anew each step); gamma: slot j weighs
        exp(-(j - 1)/gamma)."""
        super().__init__(head, target_lm_head, chunk_tokens)
        self.max_anchors, self.gamma = max_anchors, gamma

    def forward(self, feats: Features) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        anchors, valid = sample_anchors(feats.loss_mask, self.max_anchors)
        states = self.head(feats.hidden_states, feats.attention_mask, feats.input_ids, anchors)
        out = dflash_block_loss(
            states,
            anchors,
            valid,
            self.head.lm_head.weight,
            self.head.draft_token_ids,
            feats.final_hidden,
            self.target_lm_head,
            feats.loss_mask,
            self.chunk_tokens,
            self.gamma,
        )
        # acc_k / loss_k: the draft k + 1 places after the anchor, as EAGLE-3's step k.
        metrics = {"loss": out.loss, "acceptance_length": out.acceptance_length}
        for k in range(len(out.slot_losses)):
            metrics[f"loss_{k}"] = out.slot_losses[k]
            metrics[f"acc_{k}"] = out.slot_accuracy[k]
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


CONFIDENCE_TRAINING = ("joint", "frozen")


def shipped_head(target: Target, kind: str) -> Path | None:
    """The head of `kind` that heads/release/ ships for this target (same sizes and tokenizer)."""
    for head_dir in sorted(RELEASE_DIR.glob("*/")):
        if (head_dir / "head_config.json").is_file() and read_head_config(head_dir)["kind"] == kind:
            try:
                target.check_head_dir(head_dir)
            except ValueError:
                continue
            return head_dir
    return None


def check_confidence_config(head_cfg: HeadConfig) -> None:
    """Reject confidence settings that contradict each other, naming both keys."""
    if head_cfg.confidence_training not in CONFIDENCE_TRAINING:
        raise ValueError(
            f"head.confidence_training={head_cfg.confidence_training!r}; choose one of {list(CONFIDENCE_TRAINING)}"
        )
    frozen = head_cfg.confidence_training == "frozen"
    if frozen and not head_cfg.confidence:
        raise ValueError(
            "head.confidence_training=frozen trains only a confidence head: it needs head.confidence=true"
        )
    if frozen and head_cfg.confidence_drafter is None:
        raise ValueError(
            "head.confidence_training=frozen needs head.confidence_drafter: the directory of the trained head"
        )
    if not frozen and head_cfg.confidence_drafter is not None:
        raise ValueError(
            f"head.confidence_drafter={head_cfg.confidence_drafter!r} is only read when "
            "head.confidence_training=frozen (it is joint)"
        )
    if head_cfg.confidence_l2 < 0:
        raise ValueError(f"head.confidence_l2={head_cfg.confidence_l2} must be >= 0")
    if head_cfg.confidence_temperature < 0:
        raise ValueError(
            f"head.confidence_temperature={head_cfg.confidence_temperature} must be >= 0 (0 = greedy)"
        )


def trained_start(head_cfg: HeadConfig, target: Target) -> str | None:
    """The directory of the trained head training starts from (head.init=release: the head
    heads/release/ ships for this target, if any; or a head directory), None for a fresh head."""
    init = head_cfg.init
    if init == "release":
        shipped = shipped_head(target, head_cfg.kind)
        if shipped is None:
            log.info(
                "head.init=release: heads/release/ ships no %s head for this target; random start",
                head_cfg.kind,
            )
        init = "random" if shipped is None else str(shipped)
    if init in ("random", "target_layer"):
        return None
    if not (Path(init) / "head_config.json").is_file():
        raise ValueError(
            f"head.init={head_cfg.init!r}: choose random, target_layer, release or a trained head directory"
        )
    return init


def new_head(head_cfg: HeadConfig, target: Target, train_rows, start: str | None) -> nn.Module:
    """The head training starts from: the trained one in `start` (trained_start), else a fresh
    one (head.init random or target_layer)."""
    if start is not None:
        if head_cfg.variant.active():
            raise ValueError(f"head.init={start!r} brings its own layer variant: leave head.variant unset")
        log.info(
            "%s head starts from the trained head in %s (its draft vocabulary too)", head_cfg.kind, start
        )
        return load_trained_drafter(start, head_cfg, target, "head.init")
    if head_cfg.init == "target_layer" and head_cfg.kind != "eagle3":
        raise ValueError(f"head.init=target_layer is for EAGLE-3 heads; head.kind={head_cfg.kind!r}")
    if head_cfg.variant.active() and head_cfg.kind != "eagle3":
        raise ValueError(
            f"head.variant {head_cfg.variant.active()} is for EAGLE-3 heads; head.kind={head_cfg.kind!r}"
        )
    if head_cfg.kind == "eagle3":
        head = Eagle3Head.from_target(
            target.config,
            embed_weight=target.embed_weight,
            draft_vocab=draft_vocab_from_rows(train_rows, target.vocab_size, head_cfg.draft_vocab_size),
            target_layer_ids=head_cfg.layer_ids,
            lm_head_weight=target.lm_head_weight,
            variant=head_cfg.variant,
        )
        if head_cfg.init == "target_layer":
            source = min(head.target_layer_ids[-1] + 1, target.num_layers - 1)
            head.start_from_target_layer(target.layers[source])
            log.info("EAGLE-3 decoder layer starts from target layer %d", source)
        return head
    if head_cfg.kind == "dflash":
        return DFlashHead.from_target(
            target.config,
            embed_weight=target.embed_weight,
            draft_vocab=draft_vocab_from_rows(train_rows, target.vocab_size, head_cfg.draft_vocab_size),
            block_size=head_cfg.block_size,
            num_layers=head_cfg.dflash_layers,
            mask_token_id=mask_token_id(head_cfg, target),
            target_layer_ids=head_cfg.layer_ids,
            lm_head_weight=target.lm_head_weight,
        )
    if head_cfg.kind == "eagle1":
        return Eagle1Head.from_target(
            target.config, embed_weight=target.embed_weight, lm_head_weight=target.lm_head_weight
        )
    if head_cfg.kind == "medusa":
        return MedusaHead.from_target(
            target.config,
            lm_head_weight=target.lm_head_weight,
            num_heads=head_cfg.medusa_heads,
            num_layers=head_cfg.medusa_layers,
        )
    raise ValueError(f"head.kind={head_cfg.kind!r}; choose eagle3, eagle1, medusa or dflash")


def mask_token_id(head_cfg: HeadConfig, target: Target) -> int:
    """The id engines mark a block drafter's mask slots with: head.mask_token_id, else the
    tokenizer's mask token, else its highest special token that neither frames chats (eos, bos,
    pad, unk, the chat template's) nor is likely to be generated, else the last vocabulary id.
    vLLM gives every input of that id the head's learned mask embedding, the anchor too, so an
    id the target emits would blur the anchor it drafts from (never the output, which the
    target verifies)."""
    if head_cfg.mask_token_id is not None:
        return head_cfg.mask_token_id
    tokenizer = target.tokenizer
    if getattr(tokenizer, "mask_token_id", None) is not None:
        return tokenizer.mask_token_id
    framing = {tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    template = getattr(tokenizer, "chat_template", None) or ""
    spare = [
        index
        for index, token in getattr(tokenizer, "added_tokens_decoder", {}).items()
        if token.special
        and index not in framing
        and token.content not in template
        and index < target.vocab_size
    ]
    return max(spare) if spare else target.vocab_size - 1


def load_frozen_drafter(head_cfg: HeadConfig, target: Target) -> nn.Module:
    """The trained head at head.confidence_drafter, which must be of head.kind and fit the target."""
    return load_trained_drafter(head_cfg.confidence_drafter, head_cfg, target, "head.confidence_drafter")


def load_trained_drafter(path: str, head_cfg: HeadConfig, target: Target, key: str) -> nn.Module:
    """The trained head at `path` (named by config key `key`): of head.kind, fitting the target."""
    kind = read_head_config(path)["kind"]
    if kind != head_cfg.kind:
        raise ValueError(f"{key}={path!r} holds a {kind!r} head, but head.kind={head_cfg.kind!r}")
    target.check_head_dir(path)
    return load_head(
        path,
        embed_weight=target.embed_weight,
        lm_head_weight=target.lm_head_weight,
        target_config=target.config,
    )


def build_confidence(
    head_cfg: HeadConfig, head: nn.Module, target: Target, chunk_tokens: int, start: str | None = None
) -> ConfidenceTraining:
    """The confidence head to train beside `head`: the one saved with the trained head in `start`
    when it learnt the same labels (its calibration dropped: training moves the logits it was
    fitted to; the eval refits it), else a fresh one."""
    confidence = None
    if start is not None and has_confidence(start):
        saved = ConfidenceHead.from_pretrained(start, embed_weight=target.embed_weight)
        if saved.args.label_temperature == head_cfg.confidence_temperature:
            saved.args.temperatures = []
            confidence = saved
            log.info("confidence head starts from the one in %s", start)
        else:
            log.info(
                "confidence head starts fresh: %s's learnt labels at temperature %s, "
                "head.confidence_temperature=%s",
                start,
                saved.args.label_temperature,
                head_cfg.confidence_temperature,
            )
    if confidence is None:
        # EAGLE heads keep their geometry under args.layer, Medusa at the top of its args.
        hidden_size = head.args.hidden_size if head_cfg.kind == "medusa" else head.args.layer.hidden_size
        confidence = ConfidenceHead.for_drafter(
            head_cfg.kind, hidden_size, target.embed_weight, head_cfg.confidence_temperature
        )
    return ConfidenceTraining(
        confidence,
        head_cfg.confidence_gamma,
        head_cfg.confidence_temperature,
        chunk_tokens,
        head_cfg.confidence_l2,
    )


def build_objective(head_cfg: HeadConfig, target: Target, train_rows, train_cfg: TrainConfig) -> Objective:
    """The head (fresh, or the frozen drafter a confidence head is fitted to), wrapped with its loss."""
    check_confidence_config(head_cfg)
    chunk = train_cfg.loss_chunk_tokens
    if head_cfg.kind == "dflash":
        if head_cfg.confidence:
            raise ValueError(
                "head.confidence=true: the block drafter (dflash) has no confidence head; set it false"
            )
        head = new_head(head_cfg, target, train_rows, trained_start(head_cfg, target))
        return DFlashObjective(
            head, target.lm_head_weight, chunk, head_cfg.max_anchors, head_cfg.dflash_decay_gamma
        )
    frozen = head_cfg.confidence and head_cfg.confidence_training == "frozen"
    start = None if frozen else trained_start(head_cfg, target)
    head = load_frozen_drafter(head_cfg, target) if frozen else new_head(head_cfg, target, train_rows, start)
    confidence = build_confidence(head_cfg, head, target, chunk, start) if head_cfg.confidence else None
    kw = {"confidence": confidence, "train_drafter": not frozen}
    if head_cfg.kind == "eagle3":
        return Eagle3Objective(head, target.lm_head_weight, chunk, train_cfg.ttt_steps, **kw)
    if head_cfg.kind == "eagle1":
        return Eagle1Objective(head, target.lm_head_weight, chunk, train_cfg.ttt_steps, **kw)
    return MedusaObjective(head, target.lm_head_weight, chunk, **kw)
