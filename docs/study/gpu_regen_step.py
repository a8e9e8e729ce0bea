"""Regeneration's forwards on a GPU, timed: a decode step of the embedded target's shape
(random weights, bf16) at several batch sizes, and a prefill of one row against one of several
rows. Prints a table, and writes the batch size that generates the most tokens/s to --best
(docs/study/gpu_session.sh hands it to the regeneration).

    python docs/study/gpu_regen_step.py [--best /tmp/regen_batch]      (one CUDA GPU, < 1 minute)
"""

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from heads.target import CachedTarget
from kernels.bench_timing import time_per_call

SMOLLM2_135M = LlamaConfig(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
)


def timed(fn) -> float:
    """Median seconds per call over 5 calls after one warm-up (CUDA events)."""
    return time_per_call(fn, torch.device("cuda"), warmup=1, iters=5)


def decode_step(target: CachedTarget, cache, batch: int, kv_len: int):
    slots = torch.randint(kv_len // 2, kv_len, (batch, 1), device="cuda")
    mask = (torch.arange(kv_len, device="cuda")[None, :] <= slots)[:, None, None, :]
    ids = torch.randint(0, SMOLLM2_135M.vocab_size, (batch, 1), device="cuda")
    return lambda: target.forward(
        ids, slots, [layer.rows(0, batch) for layer in cache], slots, mask, num_logits=1
    )


def prefill(target: CachedTarget, cache, rows: int, length: int):
    slots = torch.arange(length, device="cuda").expand(rows, length)
    mask = (torch.arange(length, device="cuda") <= slots[:, :, None])[:, None]
    ids = torch.randint(0, SMOLLM2_135M.vocab_size, (rows, length), device="cuda")
    return lambda: target.forward(
        ids, slots, [layer.rows(0, rows) for layer in cache], slots, mask, num_logits=1
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--best", default=None, help="write the best batch size here")
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--kv-len", type=int, default=768)
    options = parser.parse_args()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(SMOLLM2_135M).to(torch.bfloat16).eval()
    target = CachedTarget(model)
    print(
        f"{torch.cuda.get_device_name()}; torch {torch.__version__}; SmolLM2-135M shape, random bf16 weights"
    )
    print("forward | rows x tokens | kv len | ms | tokens/s")
    best, best_rate = None, 0.0
    for batch in options.batches:
        cache = target.new_cache(batch, 1024)
        seconds = timed(decode_step(target, cache, batch, options.kv_len))
        print(f"decode step | {batch} x 1 | {options.kv_len} | {seconds * 1e3:.2f} | {batch / seconds:,.0f}")
        if batch / seconds > best_rate * 1.15:  # a larger batch must pay for its memory
            best, best_rate = batch, batch / seconds
        del cache
        torch.cuda.empty_cache()
    cache = target.new_cache(8, 1024)
    for rows in (1, 8):
        print(f"prefill | {rows} x 300 | 300 | {timed(prefill(target, cache, rows, 300)) * 1e3:.2f} | -")
    print(f"best batch: {best}")
    if options.best:
        with open(options.best, "w") as f:
            f.write(str(best))


if __name__ == "__main__":
    main()
