"""Confidence head (SPEC.md section 4; DSpark): c_k = P(draft token k is accepted | drafts 1..k-1 were).

    c_k = σ((wᵀ[rms(h_k) ; rms(E(x_{k-1}))] + b) / T_k)

h_k      the drafter state draft step k's distribution came from: EAGLE-3's pre-norm midlayer
         output and EAGLE-1's predicted feature (what `step` returns), Medusa head k's state
x_{k-1}  the token that step consumed (for k = 1: the last committed token); E = the target's
         embedding, shared and frozen like the heads' own `embed_tokens`
rms      RMS normalisation without weights: the pre-norm EAGLE-3 state grows along the
         residual stream, so a bare linear layer would see a different scale at every step
T_k      a per-position temperature fitted after training (sequential temperature scaling,
         train/confidence.py); 1 until fitted, the last one reused past the fitted positions

c_k does not read the drafted token x_k: it is known as soon as h_k is, before x_k is chosen,
and every sibling in a draft tree shares its parent's c.

On disk, beside the drafter in its head directory (engines read only the drafter's files):
    confidence_config.json    {"format_version": 1, "args": ConfidenceArgs}, temperatures included
    confidence.safetensors    linear.weight [1, h + e], linear.bias [1]
"""

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from heads.registry import check_target_weight, dataclass_from_dict, load_trained_state

CONFIG_FILE = "confidence_config.json"
WEIGHTS_FILE = "confidence.safetensors"
FORMAT_VERSION = 1
RMS_EPS = 1e-6


@dataclass
class ConfidenceArgs:
    hidden_size: int  # width of the drafter state h_k
    embed_size: int  # width of the target's embedding
    vocab_size: int  # the target's
    drafter_kind: str  # eagle3 | eagle1 | medusa: which state h_k is
    # Decode temperature the training labels assumed (0 = greedy: draft argmax == target argmax).
    label_temperature: float = 0.0
    # Calibration temperature per draft position (1-based position k at index k - 1); empty = none.
    temperatures: list[float] = field(default_factory=list)


def _rms(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + RMS_EPS)


class SharedEmbedding(nn.Module):
    """The target's input embedding, looked up but never saved: a non-persistent buffer, so no
    state dict (ours, or a training checkpoint beside the drafter that holds the same tensor)
    carries a second reference to a target weight."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(token_ids, self.weight)


class ConfidenceHead(nn.Module):
    def __init__(self, args: ConfidenceArgs, embed_weight: torch.Tensor):
        """embed_weight [V, e]: the target's input embedding (shared, frozen, never saved)."""
        super().__init__()
        check_temperatures(args.temperatures, "confidence temperatures")
        self.args = args
        embed_weight = check_target_weight(embed_weight, (args.vocab_size, args.embed_size), "embed_weight")
        self.embed_tokens = SharedEmbedding(embed_weight)
        self.linear = nn.Linear(args.hidden_size + args.embed_size, 1)
        # Zero, not random: a random start adds a logit of spread ~0.6 that carries no signal and
        # that a short run does not train away; calibration then has to undo a spread it cannot
        # tell from the real one. The loss is convex in these weights, so zero loses nothing.
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    @classmethod
    def for_drafter(
        cls, kind: str, hidden_size: int, embed_weight: torch.Tensor, label_temperature: float = 0.0
    ) -> "ConfidenceHead":
        """A fresh head for a drafter of `kind` whose states are hidden_size wide."""
        vocab_size, embed_size = embed_weight.shape
        args = ConfidenceArgs(hidden_size, embed_size, vocab_size, kind, label_temperature)
        return cls(args, embed_weight)

    def forward(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """hidden [..., h], prev_tokens [...] (target ids) -> uncalibrated logits [...] (float32)."""
        features = torch.cat([_rms(hidden), _rms(self.embed_tokens(prev_tokens))], dim=-1)  # [..., h + e]
        weight = self.linear.weight.float()
        return (features @ weight[0]) + self.linear.bias.float()[0]

    def temperature(self, position: int) -> float:
        """Calibration temperature of 0-based draft position `position` (1.0 when unfitted)."""
        temperatures = self.args.temperatures
        if not temperatures:
            return 1.0
        return temperatures[min(position, len(temperatures) - 1)]

    def probability(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        """Calibrated c = σ(logits / T_position) for logits of one 0-based draft position."""
        return torch.sigmoid(logits / self.temperature(position))

    def set_temperatures(self, temperatures: list[float]) -> None:
        check_temperatures(temperatures, "confidence temperatures")
        self.args.temperatures = [float(t) for t in temperatures]

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Write the two confidence files into a head directory (temporary names, then rename)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        config = {"format_version": FORMAT_VERSION, "args": dataclasses.asdict(self.args)}
        tmp_weights, tmp_config = path / (WEIGHTS_FILE + ".tmp"), path / (CONFIG_FILE + ".tmp")
        tensors = self.state_dict()
        save_file({name: t.detach().contiguous() for name, t in tensors.items()}, str(tmp_weights))
        tmp_config.write_text(json.dumps(config, indent=2) + "\n")
        os.replace(tmp_weights, path / WEIGHTS_FILE)
        os.replace(tmp_config, path / CONFIG_FILE)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, embed_weight: torch.Tensor) -> "ConfidenceHead":
        config_path, weights_path = Path(path) / CONFIG_FILE, Path(path) / WEIGHTS_FILE
        for needed in (config_path, weights_path):
            if not needed.is_file():
                raise ValueError(f"{needed}: not found (the head directory has no confidence head)")
        config = json.loads(config_path.read_text())
        if config.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{config_path}: format_version={config.get('format_version')!r}, expected {FORMAT_VERSION}"
            )
        args = dataclass_from_dict(ConfidenceArgs, config.get("args"), f"{config_path}: args")
        head = cls(args, embed_weight)
        load_trained_state(head, load_file(str(weights_path)), (), str(weights_path))
        return head


def has_confidence(path: str | os.PathLike) -> bool:
    """Whether a head directory holds a confidence head."""
    return (Path(path) / CONFIG_FILE).is_file()


def load_confidence(path: str | os.PathLike, *, embed_weight: torch.Tensor) -> ConfidenceHead | None:
    """The confidence head saved in a head directory, or None when it has none."""
    return ConfidenceHead.from_pretrained(path, embed_weight=embed_weight) if has_confidence(path) else None


def check_temperatures(temperatures: list[float], where: str) -> None:
    bad = [t for t in temperatures if not (isinstance(t, (int, float)) and 0 < t < float("inf"))]
    if bad:
        raise ValueError(f"{where}: {bad} are not positive finite temperatures")
