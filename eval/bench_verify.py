"""The verify curve: what a target forward over k new tokens costs after a cached context,
relative to one decode step (k = 1), with the target's Linear layers on torch's own path,
prepacked for oneDNN (heads/packed_linear.py) and, with --paths, compiled (torch.compile with
frozen weights; heads/target.py), plus plain greedy decoding against HF `generate`. Every
figure of one table comes from one run, the paths interleaved.

    python eval/bench_verify.py                     # the embedded target, contexts 256 and 1024
    python eval/bench_verify.py --contexts 256 --reps 15 --tokens 1 2 3 5 9 17
    python eval/bench_verify.py --paths torch auto compiled  # compiles first: minutes on a CPU
    python eval/bench_verify.py --dtype bfloat16     # bf16 weights (packed where the CPU has native bf16)

Verification of K drafts is a forward over k = K + 1 tokens; speculation pays only when that
costs little more than one step (SPEC.md section 3), so this curve prices every drafting choice.
"""

import argparse
import statistics
import time

import torch

from eval.baselines import hf_generate
from eval.plain_decoder import PlainDecoder
from heads.machine import machine_line
from heads.target import TARGET_LINEARS, Target, TargetConfig, dtype_name

PATHS = ("torch", "auto")  # the reference, then what the decoders use by default
NAMES = {"auto": "prepacked"}


def median_seconds(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def verify_curve(
    target: Target, contexts: list[int], tokens: list[int], reps: int, paths: tuple[str, ...] = PATHS
) -> dict:
    """{path: {context: {k: seconds}}}, the paths interleaved per (context, k)."""
    longest = max(contexts) + max(tokens) + 1
    decoders = {path: PlainDecoder(target.model, longest, linears=path) for path in paths}
    curve = {path: {} for path in paths}
    for context in contexts:
        prompt = torch.randint(0, target.vocab_size, (1, context + max(tokens)))
        for path, decoder in decoders.items():
            decoder.forward(prompt[:, :context], 0)
            curve[path][context] = {}
        for k in tokens:
            window = prompt[:, context : context + k]
            for path, decoder in decoders.items():
                step = lambda d=decoder, w=window, c=context: d.forward(w, c)  # noqa: E731
                curve[path][context][k] = median_seconds(step, reps)
    return curve


def plain_vs_hf(
    target: Target, prompt_len: int, new_tokens: int, rounds: int, paths: tuple[str, ...] = PATHS
) -> dict:
    """Plain greedy tokens/s of each path and of HF `generate`, interleaved, same prompt."""
    prompt = torch.randint(0, target.vocab_size, (1, prompt_len))
    decoders = {
        path: PlainDecoder(target.model, prompt_len + new_tokens, eos_token_id=[], linears=path)
        for path in paths
    }
    seconds = {name: [] for name in (*paths, "hf_greedy")}
    for _ in range(rounds + 1):  # the first round warms up
        for path, decoder in decoders.items():
            start = time.perf_counter()
            decoder.generate(prompt, new_tokens)
            seconds[path].append(time.perf_counter() - start)
        seconds["hf_greedy"].append(hf_generate(target.model, prompt, new_tokens, eos_token_id=None)[1])
    return {name: new_tokens / statistics.median(times[1:]) for name, times in seconds.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default=TargetConfig.name)
    parser.add_argument("--dtype", default=TargetConfig.dtype, choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--contexts", nargs="+", type=int, default=[256, 1024])
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 3, 5, 9, 17])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--decode-tokens", type=int, default=64, help="plain greedy run length (0 = skip)")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=TARGET_LINEARS)
    args = parser.parse_args(argv)
    if args.tokens[0] != 1:
        parser.error("--tokens must start at 1: the curve is relative to one decode step")
    target = Target.load(TargetConfig(name=args.target, dtype=args.dtype))
    paths = tuple(args.paths)
    curve = verify_curve(target, args.contexts, args.tokens, args.reps, paths)
    print(
        f"{machine_line()}; {dtype_name(target.model.dtype)}; median of {args.reps}; k = tokens in the forward (K drafts + 1)\n"
    )
    print("| linears | context | " + " | ".join(f"k={k}" for k in args.tokens) + " |")
    print("|---|---|" + "---|" * len(args.tokens))
    for path in paths:
        for context, row in curve[path].items():
            step = row[1]
            cells = [f"{1000 * step:.1f} ms"] + [f"{row[k] / step:.2f}" for k in args.tokens[1:]]
            print(f"| {NAMES.get(path, path)} | {context} | " + " | ".join(cells) + " |")
    if args.decode_tokens:
        rates = plain_vs_hf(target, 256, args.decode_tokens, rounds=3, paths=paths)
        print(
            f"\nplain greedy, 256-token prompt, {args.decode_tokens} new tokens (tokens/s): "
            + ", ".join(f"{NAMES.get(k, k)} {v:.1f}" for k, v in rates.items())
        )


if __name__ == "__main__":
    main()
