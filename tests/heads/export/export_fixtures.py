"""Tiny trained-looking heads for the export tests: every tensor random (a norm of ones or a
zero ResBlock would let a swapped or default tensor pass unnoticed)."""

import torch

from heads.draft_vocab import DraftVocab, build_draft_vocab
from heads.export import DrafterMeta, TargetWeights
from heads.registry import build_head
from tests.heads.head_fixtures import LAYER_IDS, tiny_target

DRAFT_VOCAB = 96
MEDUSA_HEADS = 3


def target_weights(model=None) -> TargetWeights:
    return TargetWeights.from_model(model if model is not None else tiny_target())


@torch.no_grad()
def _randomise(head, seed: int):
    generator = torch.Generator().manual_seed(seed)
    for name, param in head.named_parameters():
        if param.requires_grad:
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
    if kind == "eagle3":
        vocab = (
            build_draft_vocab(torch.arange(config.vocab_size, 0, -1), DRAFT_VOCAB)
            if reduced_vocab
            else DraftVocab.full(config.vocab_size)
        )
        head = build_head(
            "eagle3",
            config,
            embed_weight=target.embed_weight,
            draft_vocab=vocab,
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


def meta(**overrides) -> DrafterMeta:
    settings = dict(
        target_name="tiny-llama",
        target_architectures=["LlamaForCausalLM"],
        tokenizer_hash="f" * 64,
        draft_length=4,
        acceptance_length=2.5,
        task_acceptance_length={"mt_bench": 2.25, "gsm8k": 2.75},
        min_acceptance_length=1.2,
        forced=False,
    )
    settings.update(overrides)
    return DrafterMeta(**settings)
