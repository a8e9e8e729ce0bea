"""The shipped EAGLE-3 head served by vLLM's CPU build beside our decoder (BENCHMARKS.md
"Served by vLLM"): greedy, fp32, K=3, the first N held-out chat prompts, tokens/s and AL of
vLLM with and without the head, and of our decoder and plain loop on the same prompts.

    .venv/bin/python docs/study/vllm_served.py [--prompts 12] [--max-tokens 128]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from eval.config import EvalConfig
from eval.engines.vllm_served import vllm_generate
from eval.run import encode_turn, load_trained_head, make_decoder
from heads.export.__main__ import main as export_main
from heads.target import Target, TargetConfig

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "heads" / "release" / "smollm2-135m-eagle3"
K = 3

parser = argparse.ArgumentParser()
parser.add_argument("--prompts", type=int, default=12)
parser.add_argument("--max-tokens", type=int, default=128)
args = parser.parse_args()

target = Target.load(TargetConfig(name="smollm2-135m-instruct", dtype="float32", device="cpu"))
lines = (ROOT / "docs" / "study" / "heldout_chat.jsonl").read_text().splitlines()[: args.prompts]
prompts = [encode_turn(target, [], json.loads(line)["turns"][0]) for line in lines]

with tempfile.TemporaryDirectory() as tmp:
    export = export_main(
        ["--head", str(RELEASE), "--target", "smollm2-135m-instruct", "--format", "vllm",
         "--out", f"{tmp}/vllm", "--force", "--draft-length", str(K)]
    )  # fmt: skip
    plain = vllm_generate(target.model_dir, prompts, args.max_tokens)
    served = vllm_generate(target.model_dir, prompts, args.max_tokens, export, "eagle3", K)

head = load_trained_head(target, RELEASE)
decoder = make_decoder(target, head, "eagle3", EvalConfig(draft_length=K, policy="static"), 2048)
decoder.generate(prompts[0], 8)  # warm-up
rows = {}
for name, generate in (("ours, plain loop", decoder.generate_plain), ("ours, EAGLE-3 K=3", decoder.generate)):
    start, tokens, emitted, rounds = time.perf_counter(), 0, 0, 0
    for prompt in prompts:
        generation = generate(prompt, args.max_tokens)
        tokens += len(generation.tokens)
        emitted += generation.metrics.emitted_tokens
        rounds += generation.metrics.verification_rounds
    rows[name] = (tokens / (time.perf_counter() - start), emitted / rounds if rounds else 1.0)

print(f"{len(prompts)} held-out chat prompts, <= {args.max_tokens} new tokens, greedy, fp32, 2 threads")
print("| run | tokens/s | AL | greedy output |")
print("|---|---|---|---|")
same = "identical to vLLM plain" if served.outputs == plain.outputs else "DIFFERS from vLLM plain"
print(f"| vLLM 0.32 CPU, plain | {plain.tokens / plain.seconds:.1f} | 1.00 | |")
print(
    f"| vLLM 0.32 CPU, our vllm export, K=3 | {served.tokens / served.seconds:.1f} | "
    f"{served.acceptance_length:.2f} | {same} |"
)
for name, (rate, al) in rows.items():
    print(f"| {name} | {rate:.1f} | {al:.2f} | |")
print("vLLM spec counters:", served.spec)
