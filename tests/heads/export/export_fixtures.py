"""Tiny trained-looking heads for the export tests: every tensor random (a norm of ones or a
zero ResBlock would let a swapped or default tensor pass unnoticed)."""

from dataclasses import asdict, replace

import torch

from eval.verdict import IdentityCheck, Verdict
from heads.draft_vocab import DraftVocab, build_draft_vocab
from heads.export import DrafterMeta, TargetWeights
from heads.export.gate import GateDecision
from heads.registry import build_head
from tests.heads.head_fixtures import LAYER_IDS, tiny_target

DRAFT_VOCAB = 96
MEDUSA_HEADS = 3
DFLASH_BLOCK, DFLASH_LAYERS, MASK_TOKEN = 4, 2, 127


def target_weights(model=None) -> TargetWeights:
    return TargetWeights.from_model(model if model is not None else tiny_target())


@torch.no_grad()
def _randomise(head, seed: int):
    generator = torch.Generator().manual_seed(seed)
    for name, param in head.named_parameters():
        if param.requires_grad:  # the mask embedding too: not the mean embedding it starts as
            param.copy_(
                torch.randn(param.shape, generator=generator) * 0.1
                + (1.0 if name.endswith("norm.weight") else 0.0)
            )
    return head.eval()


def make_head(
    kind: str, target: TargetWeights, *, reduced_vocab: bool = True, medusa_layers: int = 2, seed: int = 0
):
    """A head of `kind` for the tiny target, every trained tensor random."""
    config = target.config
    vocab = (
        build_draft_vocab(torch.arange(config.vocab_size, 0, -1), DRAFT_VOCAB)
        if reduced_vocab
        else DraftVocab.full(config.vocab_size)
    )
    if kind == "eagle3":
        head = build_head(
            "eagle3",
            config,
            embed_weight=target.embed_weight,
            draft_vocab=vocab,
            target_layer_ids=LAYER_IDS,
            lm_head_weight=target.lm_head_weight,
        )
    elif kind == "dflash":
        head = build_head(
            "dflash",
            config,
            embed_weight=target.embed_weight,
            draft_vocab=vocab,
            block_size=DFLASH_BLOCK,
            num_layers=DFLASH_LAYERS,
            mask_token_id=MASK_TOKEN,
            target_layer_ids=LAYER_IDS,
            lm_head_weight=target.lm_head_weight,
        )
    elif kind == "eagle1":
        head = build_head(
            "eagle1", config, embed_weight=target.embed_weight, lm_head_weight=target.lm_head_weight
        )
    else:
        head = build_head(
            "medusa",
            config,
            lm_head_weight=target.lm_head_weight,
            num_heads=MEDUSA_HEADS,
            num_layers=medusa_layers,
        )
    return _randomise(head, seed)


@torch.no_grad()
def share_medusa_layers(head):
    """Make every ResBlock of each head equal its first (what the reference layout can hold)."""
    for block in head.blocks:
        for layer in block.layers[1:]:
            layer.weight.copy_(block.layers[0].weight)
            layer.bias.copy_(block.layers[0].bias)
    return head


def verdict(head_sha256: str = "e" * 64, **overrides) -> Verdict:
    """A clean verdict: mt_bench 2.25, gsm8k 2.75 against a break-even of 1.5, identity held."""
    clean = Verdict(
        head_dir="run/eval/calibrated_head",
        head_sha256=head_sha256,
        trained_head_sha256=head_sha256,
        head_kind="eagle3",
        drafting={"drafter": "eagle3 chain", "policy": "static", "draft_length": 4, "temperature": 0.0},
        acceptance_length={"mt_bench": 2.25, "gsm8k": 2.75},
        overall_acceptance_length=2.5,
        break_even_acceptance_length=1.5,
        identity=IdentityCheck(turns=16, plain_mismatches=0, hf_mismatches=0, greedy_pass=False),
    )
    return replace(clean, **overrides)


def meta(**overrides) -> DrafterMeta:
    decision = GateDecision(verdict(), 1.5, "> the break-even 1.500", refusals=(), forced=False)
    settings = dict(
        target_name="tiny-llama",
        target_architectures=["LlamaForCausalLM"],
        tokenizer_hash="f" * 64,
        draft_length=4,
        gate=decision.record(),
        verdict=asdict(decision.verdict),
    )
    settings.update(overrides)
    return DrafterMeta(**settings)
