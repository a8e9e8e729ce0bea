"""Medusa heads (SPEC.md section 4), in vLLM's `MedusaModel` parameter layout.

    blocks.{i}.layers.{l}.weight/bias   head i's ResBlocks (zero-initialised weights)
    lm_heads.{i}.weight                 head i's own lm_head [V, h], a trainable copy of the target's

Head i reads the target's final_hidden at position t (after its final norm) and predicts the
token at t + i + 2 (the target's own lm_head predicts t + 1).
"""

from dataclasses import dataclass

import torch
from torch import nn

from heads.blocks import ResBlock
from heads.registry import check_target_weight, load_trained_state, read_head, trained_state, write_head


@dataclass
class MedusaArgs:
    hidden_size: int
    vocab_size: int
    num_heads: int
    num_layers: int  # ResBlocks per head

    def check_fits(self, target_config) -> None:
        """Raise a ValueError naming the first head field that does not fit the target config."""
        for name, head_value, target_value in (
            ("hidden_size", self.hidden_size, target_config.hidden_size),
            ("vocab_size", self.vocab_size, target_config.vocab_size),
        ):
            if head_value != target_value:
                raise ValueError(
                    f"head config field {name!r} = {head_value} does not fit the target ({name} = {target_value})"
                )
        if self.num_heads < 1 or self.num_layers < 0:
            raise ValueError(
                f"head config fields num_heads={self.num_heads} (>= 1) and num_layers={self.num_layers} (>= 0) are out of range"
            )


class MedusaBlock(nn.Module):
    def __init__(self, hidden_size: int, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList([ResBlock(hidden_size) for _ in range(num_layers)])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden


class MedusaHead(nn.Module):
    kind = "medusa"
    frozen_weights: tuple[str, ...] = ()

    @property
    def target_layer_ids(self) -> list[int]:
        """Medusa reads only the target's final hidden state."""
        return []

    def __init__(self, args: MedusaArgs, lm_head_weight: torch.Tensor | None = None):
        """lm_head_weight [V, h]: the target's, copied into every head (random init without it)."""
        super().__init__()
        self.args = args
        self.blocks = nn.ModuleList(
            [MedusaBlock(args.hidden_size, args.num_layers) for _ in range(args.num_heads)]
        )
        if lm_head_weight is None:
            self.lm_heads = nn.ModuleList(
                [nn.Linear(args.hidden_size, args.vocab_size, bias=False) for _ in range(args.num_heads)]
            )
            return
        lm_head_weight = check_target_weight(
            lm_head_weight, (args.vocab_size, args.hidden_size), "lm_head_weight"
        )
        self.lm_heads = nn.ModuleList()
        for _ in range(args.num_heads):
            lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False, device="meta")
            lm_head.weight = nn.Parameter(lm_head_weight.clone())
            self.lm_heads.append(lm_head)

    @classmethod
    def from_target(
        cls,
        target_config,
        *,
        lm_head_weight: torch.Tensor,
        num_heads: int,
        num_layers: int,
        embed_weight: torch.Tensor | None = None,
    ) -> "MedusaHead":
        """A fresh head for a target; embed_weight is unused (uniform `build_head` API)."""
        args = MedusaArgs(target_config.hidden_size, target_config.vocab_size, num_heads, num_layers)
        args.check_fits(target_config)
        return cls(args, lm_head_weight)

    @classmethod
    def from_pretrained(
        cls,
        path,
        *,
        embed_weight: torch.Tensor | None = None,
        lm_head_weight: torch.Tensor | None = None,
        target_config=None,
    ) -> "MedusaHead":
        """Load a saved head (its lm_heads are saved); the weight arguments are unused."""
        args, tensors = read_head(path, cls.kind, MedusaArgs)
        if target_config is not None:
            args.check_fits(target_config)
        head = cls(args)
        load_trained_state(head, tensors, cls.frozen_weights, str(path))
        return head

    def save_pretrained(self, path) -> None:
        write_head(path, self.kind, self.args, trained_state(self, self.frozen_weights))

    @property
    def draft_token_ids(self) -> torch.Tensor:
        return torch.arange(self.args.vocab_size, device=self.lm_heads[0].weight.device)

    def forward(self, final_hidden: torch.Tensor) -> list[torch.Tensor]:
        """final_hidden [B, S, h] -> one [B, S, h] per head (the loss projects them in chunks)."""
        final_hidden = final_hidden.to(self.lm_heads[0].weight.dtype)
        return [block(final_hidden) for block in self.blocks]

    def logits(self, final_hidden: torch.Tensor) -> torch.Tensor:
        """final_hidden [B, S, h] -> logits [num_heads, B, S, V]; head i scores the token at t + i + 2."""
        return torch.stack([lm_head(hidden) for lm_head, hidden in zip(self.lm_heads, self(final_hidden))])
