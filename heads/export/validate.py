"""Every export is read back the way its engine reads it before it is kept.

Four checks, each an error naming what failed:
  0. the directory holds no weights file but the layout's at its top level, where engine
     loaders glob (vLLM reads every `*.safetensors` there, and stops on a stranger's keys),
     besides the side files the engine opens by name (a block drafter's mask_embedding.pt);
  1. the files against the engine's published table (layouts.read_layout): a missing,
     unexpected, mis-shaped or mistyped key, or a config our head would be misread under;
  2. every trained tensor of the head rebuilt from the files, byte for byte against the
     trained head's: no export carries random or default weights (a norm of ones passes
     only if the trained norm is ones);
  3. the rebuilt head's logits on a fixed batch against the trained head's, exactly.
"""

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from heads.export.confidence import check_confidence
from heads.export.layouts import Layout, TargetWeights, read_config, read_layout, same_bytes
from heads.registry import trained_state

PROBE_BATCH, PROBE_TOKENS, PROBE_SEED = 2, 8, 0


def _probe_inputs(head: nn.Module, hidden_size: int, vocab_size: int, num_features: int = 4):
    """Seeded features [B, T, h] x num_features, token ids, positions and a causal mask."""
    generator = torch.Generator().manual_seed(PROBE_SEED)
    dtype = next(t.dtype for t in trained_state(head, head.frozen_weights).values() if t.is_floating_point())
    features = [
        torch.randn(PROBE_BATCH, PROBE_TOKENS, hidden_size, generator=generator).to(dtype)
        for _ in range(num_features)
    ]
    input_ids = torch.randint(0, vocab_size, (PROBE_BATCH, PROBE_TOKENS), generator=generator)
    positions = torch.arange(PROBE_TOKENS).expand(PROBE_BATCH, PROBE_TOKENS)
    mask = torch.ones(PROBE_TOKENS, PROBE_TOKENS, dtype=torch.bool).tril()[None, None]  # [1, 1, T, T]
    return features, input_ids, positions, mask


@torch.no_grad()
def _eagle3_logits(head) -> torch.Tensor:
    """Two draft steps: from the fused target features, then from the head's own output."""
    features, input_ids, positions, mask = _probe_inputs(
        head, head.args.layer.hidden_size, head.args.vocab_size
    )
    fused = head.project_features(features[:3], None)
    hidden, first = head.step(fused, input_ids, positions, None, None, mask)
    _, second = head.step(hidden, input_ids, positions, None, None, mask)
    return torch.cat([first, second])


@torch.no_grad()
def _eagle1_logits(head) -> torch.Tensor:
    features, input_ids, positions, mask = _probe_inputs(
        head, head.args.layer.hidden_size, head.args.vocab_size
    )
    hidden, first = head.step(head.project_features([], features[3]), input_ids, positions, None, None, mask)
    _, second = head.step(hidden, input_ids, positions, None, None, mask)
    return torch.cat([first, second])


@torch.no_grad()
def _medusa_logits(head) -> torch.Tensor:
    features, _, _, _ = _probe_inputs(head, head.args.hidden_size, head.args.vocab_size)
    return head.logits(features[3])


@torch.no_grad()
def _dflash_logits(head) -> torch.Tensor:
    """Blocks at two anchors over the seeded context: every trained tensor, the mask embedding too."""
    features, input_ids, _, _ = _probe_inputs(
        head, head.args.layer.hidden_size, head.args.vocab_size, len(head.target_layer_ids)
    )
    anchors = torch.tensor([[1, PROBE_TOKENS - 1]]).expand(PROBE_BATCH, -1)
    states = head(features, torch.ones_like(input_ids), input_ids, anchors)  # [B, 2, block_size, h]
    return head.lm_head(states)


PROBES: dict[str, Callable[[nn.Module], torch.Tensor]] = {
    "eagle3": _eagle3_logits,
    "eagle1": _eagle1_logits,
    "medusa": _medusa_logits,
    "dflash": _dflash_logits,
}


def check_same_weights(trained: nn.Module, rebuilt: nn.Module, where: str) -> None:
    ours, theirs = (
        trained_state(trained, trained.frozen_weights),
        trained_state(rebuilt, rebuilt.frozen_weights),
    )
    if set(ours) != set(theirs):
        raise ValueError(
            f"{where}: rebuilt head has keys {sorted(set(theirs) ^ set(ours))} the trained head lacks or has"
        )
    for name, tensor in ours.items():
        if not same_bytes(tensor, theirs[name]):
            raise ValueError(
                f"{where}: tensor {name!r} read back from the export is not the trained tensor byte for byte"
            )


def check_same_logits(trained: nn.Module, rebuilt: nn.Module, where: str) -> None:
    probe = PROBES[trained.kind]
    expected, actual = probe(trained.eval()), probe(rebuilt.eval())
    if not torch.equal(expected, actual):
        diff = (expected.float() - actual.float()).abs().max()
        raise ValueError(
            f"{where}: the reloaded head's logits differ from the trained head's (max |diff| {diff:.3g})"
        )


ENGINE_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")  # what loaders glob for


def check_engine_reads_only_the_drafter(out_dir: Path, layout: Layout) -> None:
    others = sorted(
        path.name
        for pattern in ENGINE_WEIGHT_PATTERNS
        for path in out_dir.glob(pattern)
        if path.name not in (layout.weights_file, *layout.side_files)
    )
    if others:
        raise ValueError(
            f"{out_dir}: {others} beside {layout.weights_file}: the {layout.engine} loader would read "
            "them as drafter weights; files an engine must not load belong in a subfolder"
        )


def validate_export(out_dir: Path, layout: Layout, head: nn.Module, target: TargetWeights) -> None:
    """Raise a ValueError naming the first problem with an export directory."""
    where = str(out_dir)
    check_engine_reads_only_the_drafter(out_dir, layout)
    rebuilt = read_layout(out_dir, layout, target)
    check_same_weights(head, rebuilt, where)
    check_same_logits(head, rebuilt, where)
    check_confidence(out_dir, read_config(out_dir)["drafter"]["confidence"])
