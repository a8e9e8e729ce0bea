"""Building blocks shared by the draft heads, and by the decoder's cached target forward.

The geometry (sizes, GQA, norm epsilon, RoPE) is read from the target's Hugging Face config
once, into a plain `LayerGeometry`, so a head can be rebuilt from its saved JSON without the
target. Numerics follow transformers' Llama code (RMSNorm and RoPE tables in fp32), so a layer
given a Llama/Qwen2/Qwen3/Mistral layer's weights gives that layer's outputs. Mistral's sliding
window is not applied here: the caller's mask must carry it when a context outgrows the window.
Leaves first: geometry, norm, RoPE, MLP, attention, decoder layer, ResBlock.
"""

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from heads.kv_cache import KVCache

# Which target families we read, and what their attention adds to Llama's.
_QKV_BIAS_MODEL_TYPES = {"qwen2"}  # Qwen2 hard-codes bias on q/k/v (not o); its config has no flag
_QK_NORM_MODEL_TYPES = {"qwen3"}  # per-head RMSNorm on q and k before RoPE
SUPPORTED_MODEL_TYPES = {"llama", "mistral", "qwen2", "qwen3"}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    """RoPE settings; the scaling fields are read only by the rope_type that uses them."""

    rope_type: str = "default"
    rope_theta: float = 10000.0
    factor: float = 1.0  # linear, llama3
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 8192  # llama3


@dataclass(frozen=True)
class LayerGeometry:
    """Everything a decoder layer needs to know about its shape, as plain JSON-able values."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    @classmethod
    def from_config(cls, config) -> "LayerGeometry":
        """The target's own layer geometry, from its HF config (Llama, Mistral, Qwen2, Qwen3)."""
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"target config model_type={model_type!r} is not supported "
                f"(supported: {sorted(SUPPORTED_MODEL_TYPES)})"
            )
        hidden_act = getattr(config, "hidden_act", "silu")
        if hidden_act != "silu":
            raise ValueError(f"target config hidden_act={hidden_act!r}: only 'silu' (SwiGLU) is supported")
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(
                f"target config num_attention_heads={num_heads} is not a multiple of "
                f"num_key_value_heads={num_kv_heads}"
            )
        attention_bias = bool(getattr(config, "attention_bias", False))
        return cls(
            hidden_size=config.hidden_size,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=float(config.rms_norm_eps),
            max_position_embeddings=config.max_position_embeddings,
            rope=rope_from_config(config),
            qkv_bias=attention_bias or model_type in _QKV_BIAS_MODEL_TYPES,
            o_bias=attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            qk_norm=model_type in _QK_NORM_MODEL_TYPES,
        )

    def draft_layout(self) -> "LayerGeometry":
        """Same sizes, Llama layout: what serving engines build for any EAGLE draft layer."""
        return replace(self, qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False)


def rope_from_config(config) -> RopeConfig:
    """Read RoPE from transformers 5 `rope_parameters` or the older `rope_theta` + `rope_scaling`."""
    params = getattr(config, "rope_parameters", None)
    if params is None:
        params = {
            "rope_theta": getattr(config, "rope_theta", 10000.0),
            **(getattr(config, "rope_scaling", None) or {}),
        }
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"target config rope_type={rope_type!r} is not supported by the draft heads "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("target config partial_rotary_factor != 1.0 is not supported by the draft heads")
    defaults = RopeConfig()
    return RopeConfig(
        rope_type=rope_type,
        rope_theta=float(params["rope_theta"]),
        factor=float(params.get("factor", defaults.factor)),
        low_freq_factor=float(params.get("low_freq_factor", defaults.low_freq_factor)),
        high_freq_factor=float(params.get("high_freq_factor", defaults.high_freq_factor)),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", defaults.original_max_position_embeddings)
        ),
    )


def inverse_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    """RoPE inverse frequencies [head_dim / 2] in fp32, as transformers computes them."""
    inv_freq = 1.0 / (rope.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    if rope.rope_type == "default":
        return inv_freq
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        old_len = rope.original_max_position_embeddings
        low_freq_wavelen = old_len / rope.low_freq_factor
        high_freq_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    raise ValueError(f"rope_type={rope.rope_type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and cast back before the weight, as transformers does.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, rope: RopeConfig):
        super().__init__()
        self.head_dim = head_dim
        self.rope = rope
        self.register_buffer("inv_freq", inverse_frequencies(head_dim, rope), persistent=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        # Casting a head to bf16 must not cast the frequency table: engines build it in fp32.
        self.inv_freq = inverse_frequencies(self.head_dim, self.rope).to(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, S, head_dim] for positions [B, S]."""
        freqs = positions[..., None].float() * self.inv_freq  # [B, S, head_dim / 2]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, heads, S, head_dim] by cos/sin [B, S, head_dim] (rotate-half convention)."""
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class SwiGLU(nn.Module):
    def __init__(self, geometry: LayerGeometry):
        super().__init__()
        hidden, inner, bias = geometry.hidden_size, geometry.intermediate_size, geometry.mlp_bias
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def grouped_attention(
    query: torch.Tensor,  # [B, heads, S, head_dim]
    key: torch.Tensor,  # [B, kv_heads, L, head_dim]
    value: torch.Tensor,  # [B, kv_heads, L, head_dim]
    attn_mask: torch.Tensor,  # [B or 1, 1, S, L] bool, True = attend
    scale: float,
    row_order: torch.Tensor | None = None,  # [1, S, L]: `attended_first` (attn_mask is its mask)
) -> torch.Tensor:
    """Masked attention as two batched matmuls, the query heads sharing a KV head stacked as
    rows of one product (no per-head copies of K/V), softmax in fp32: [B, heads, S, head_dim].

    Why: on a CPU, torch's fused attention kernel runs bf16 / fp16 several times slower than
    fp32 while the matmuls run bf16 natively: a 64-row decode step of the embedded target in bf16
    spent 88% of its time there, 2.4x fp32's step; with this, bf16 regenerates 1.3x faster than
    fp32 (BENCHMARKS.md, session 11); a bf16 draft head's attention 0.52 -> ~0.2 ms a step
    (session 28). fp32 keeps the fused kernel, faster there."""
    batch, heads, length, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    group = heads // kv_heads
    rows = query.reshape(batch, kv_heads, group * length, dim)  # head h = kv head h // group
    # K times the queries, not the queries times K^T: K is a slice of the cache, and torch's CPU
    # bf16 matmul copies a strided K^T whole (3x the time of the product), not a strided K.
    scores = torch.matmul(key, rows.transpose(-1, -2)).transpose(-1, -2)  # [B, kv, gS, L]
    if row_order is not None:
        return _in_row_order(scores, value, attn_mask, scale, row_order)
    scores = scores.float() * scale
    mask = attn_mask.unsqueeze(2).expand(-1, -1, group, -1, -1).reshape(-1, 1, group * length, kv_len)
    probs = torch.softmax(scores.masked_fill(~mask, -torch.inf), dim=-1).to(value.dtype)
    return torch.matmul(probs, value).reshape(batch, heads, length, dim)


def _in_row_order(scores, value, attn_mask, scale, row_order) -> torch.Tensor:
    """The rest of grouped_attention with each query row's scores [B, kv, group * S, L] and the
    values in its own order (row_order [1, S, L]): per row the softmax and probs x values product
    of a one-row decode step, of its shapes and in its order. A score is one dot product wherever
    its key sits, so only the scores are reordered; the values are gathered per row."""
    batch, kv_heads, group_rows, kv_len = scores.shape
    length = row_order.shape[1]
    group = group_rows // length
    order = row_order[:, None, None].expand(batch, kv_heads, group, length, kv_len)
    scores = scores.reshape(batch, kv_heads, group, length, kv_len).gather(-1, order).float() * scale
    mask = attn_mask[:, :, None]  # [1, 1, 1, S, L]
    probs = torch.softmax(scores.masked_fill(~mask, -torch.inf), dim=-1).to(value.dtype)
    values = value[:, :, row_order[0]]  # [B, kv, S, L, dim]
    out = torch.matmul(probs.transpose(2, 3), values)  # [B, kv, S, group, dim]
    return out.transpose(2, 3).reshape(batch, kv_heads * group, length, -1)


def attended_first(attn_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For masks whose rows do not attend a prefix of the cache (a draft tree: a node attends the
    prefix, then its ancestors wherever the tree put them): per row, the cache slots in the order
    that puts the attended ones first, in slot order ([1, S, L]), and the mask over that order
    ([1, 1, S, L], a prefix per row). `grouped_attention` given them sums each row's
    terms at the places a decode step of the same token has them, so a tree node scores bit for
    bit as its decode step in bf16 too (BENCHMARKS.md, session 29)."""
    mask = attn_mask[:, 0]
    order = torch.argsort((~mask).to(torch.uint8), dim=-1, stable=True)
    slots = torch.arange(mask.shape[-1], device=mask.device)
    return order, (slots < mask.sum(dim=-1, keepdim=True)).unsqueeze(1)


def grouped_attention_applies(query: torch.Tensor) -> bool:
    """Where `grouped_attention` beats torch's fused kernel: reduced precision on a CPU. Callers
    take it for cached decoding only: a whole row without a cache would materialise [S, S]
    scores per head."""
    return query.device.type == "cpu" and query.dtype != torch.float32


class Attention(nn.Module):
    """GQA self-attention with RoPE at explicit positions, an explicit bool mask and a static cache.

    `input_size` differs from hidden_size for EAGLE-3, whose q/k/v read [embedding; feature].
    """

    def __init__(self, geometry: LayerGeometry, input_size: int | None = None):
        super().__init__()
        g = geometry
        input_size = input_size or g.hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = (
            g.num_attention_heads,
            g.num_key_value_heads,
            g.head_dim,
        )
        self.q_proj = nn.Linear(input_size, g.num_attention_heads * g.head_dim, bias=g.qkv_bias)
        self.k_proj = nn.Linear(input_size, g.num_key_value_heads * g.head_dim, bias=g.qkv_bias)
        self.v_proj = nn.Linear(input_size, g.num_key_value_heads * g.head_dim, bias=g.qkv_bias)
        self.o_proj = nn.Linear(g.num_attention_heads * g.head_dim, g.hidden_size, bias=g.o_bias)
        if g.qk_norm:
            self.q_norm = RMSNorm(g.head_dim, g.rms_norm_eps)
            self.k_norm = RMSNorm(g.head_dim, g.rms_norm_eps)
        self.qk_norm = g.qk_norm
        self.rotary = RotaryEmbedding(g.head_dim, g.rope)

    def project(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, S, in], positions [B, S] -> q [B, heads, S, d], k and v [B, kv_heads, S, d], rotated."""
        batch, seq = x.shape[:2]
        q = self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim)
        if self.qk_norm:
            q = self.q_norm(q)
        cos, sin = self.rotary(positions, x.dtype)
        k, v = self.project_keys_values(x, positions, (cos, sin))
        return apply_rotary(q.transpose(1, 2), cos, sin), k, v

    def project_keys_values(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, S, in], positions [B, S] -> k and v [B, kv_heads, S, d], k rotated: keys and
        values without queries (a block drafter's context). rotary: cos/sin already computed."""
        batch, seq = x.shape[:2]
        k = self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            k = self.k_norm(k)
        cos, sin = rotary if rotary is not None else self.rotary(positions, x.dtype)
        return apply_rotary(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        """attended [B, heads, S, d] -> [B, S, hidden]."""
        batch, _, seq, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim))

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None = None,
        cache_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [B, S, in]; positions [B, S]; mask bool [B or 1, 1, S, Skv] (True = attend), where Skv
        is S without a cache and cache.max_len with one; K/V are written at cache_positions [S]."""
        q, k, v = self.project(x, positions)
        if cache is not None:
            k, v = cache.update(cache_positions, k, v)
            if grouped_attention_applies(q):
                return self.output(grouped_attention(q, k, v, mask, self.head_dim**-0.5))
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.output(attended)


class DecoderLayer(nn.Module):
    """A Llama decoder layer; `input_layernorm=False` is EAGLE-1's first layer (vLLM layout)."""

    def __init__(self, geometry: LayerGeometry, input_layernorm: bool = True):
        super().__init__()
        if input_layernorm:
            self.input_layernorm = RMSNorm(geometry.hidden_size, geometry.rms_norm_eps)
        self.has_input_layernorm = input_layernorm
        self.self_attn = Attention(geometry)
        self.post_attention_layernorm = RMSNorm(geometry.hidden_size, geometry.rms_norm_eps)
        self.mlp = SwiGLU(geometry)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None = None,
        cache_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """hidden [B, S, H] -> [B, S, H]; arguments as in `Attention.forward`."""
        attn_input = self.input_layernorm(hidden) if self.has_input_layernorm else hidden
        hidden = hidden + self.self_attn(attn_input, positions, mask, cache, cache_positions)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class ResBlock(nn.Linear):
    """Medusa's block: x + SiLU(W x + b), W zero-initialised so a fresh head starts near identity.

    A Linear subclass so its parameters are `weight`/`bias`, as in vLLM's MedusaModel.
    """

    def __init__(self, hidden_size: int):
        super().__init__(hidden_size, hidden_size, bias=True)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(super().forward(x))


def causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """attention_mask [B, T] (1 = real token) -> bool [B, 1, T, T]: key j visible to query t iff
    j <= t and j is real. Each query also sees itself, so padded rows never softmax over nothing."""
    seq = attention_mask.shape[1]
    idx = torch.arange(seq, device=attention_mask.device)
    lower = idx[None, :] <= idx[:, None]  # [T, T]
    visible = lower[None] & attention_mask.bool()[:, None, :]
    return (visible | torch.eye(seq, dtype=torch.bool, device=attention_mask.device))[:, None]


def unrolled_attention(
    query: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], step0_mask: torch.Tensor
) -> torch.Tensor:
    """Attention of TTT step k = len(keys) - 1, without materialising (k + 1) x T keys per query.

    query [B, heads, T, d]; keys/values: one [B, kv_heads, T, d] per step so far; step0_mask bool
    [B, 1, T, T]. Query t sees step-0 keys where step0_mask allows (causal, real tokens), and the
    keys of steps 1..k at the same row t only: at decode time those are the draft tokens it
    extended row t with (SpecForge's cache_hidden pattern). Softmax in fp32, as transformers does.
    """
    batch, heads, seq, dim = query.shape
    kv_heads = keys[0].shape[1]
    grouped = query.view(batch, kv_heads, heads // kv_heads, seq, dim)  # head n -> kv head n // group
    scale = 1 / math.sqrt(dim)
    scores = (grouped @ keys[0][:, :, None].transpose(-1, -2)) * scale  # [B, kv_heads, group, T, T]
    scores = scores.masked_fill(~step0_mask[:, :, None], float("-inf"))
    diagonal = [(grouped * k[:, :, None]).sum(-1, keepdim=True) * scale for k in keys[1:]]  # [..., T, 1] each
    weights = torch.softmax(torch.cat([scores, *diagonal], dim=-1), dim=-1, dtype=torch.float32).to(
        query.dtype
    )
    attended = weights[..., :seq] @ values[0][:, :, None]  # [B, kv_heads, group, T, d]
    for step, value in enumerate(values[1:]):
        attended = attended + weights[..., seq + step, None] * value[:, :, None]
    return attended.reshape(batch, heads, seq, dim)


def shift_left(input_ids: torch.Tensor, shift: int) -> torch.Tensor:
    """[B, T] -> [B, T] with row t holding token t + shift (token 0 past the end)."""
    pad = input_ids.new_zeros(input_ids.shape[0], min(shift, input_ids.shape[1]))
    return torch.cat([input_ids[:, shift:], pad], dim=1)


def last_positions(hidden: torch.Tensor, count: int | None) -> torch.Tensor:
    """[B, S, ...] -> its last `count` positions [B, count, ...] (all for None, none for 0): the
    rows a decode-time forward computes logits for (the target's and the EAGLE heads' steps)."""
    return hidden if count is None else hidden[:, hidden.shape[1] - count :]
