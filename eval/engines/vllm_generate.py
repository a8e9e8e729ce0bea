"""Greedy generation in vLLM, with or without one of our exported drafters, and vLLM's own
speculative-decoding counters. Runs inside vLLM's environment (eval/engines/setup_vllm.sh),
which has its own torch and transformers: it imports nothing of ours.

    .venv-vllm/bin/python eval/engines/vllm_generate.py --target <hf dir> --prompts prompts.json \\
        --out out.json [--drafter <export dir> --method eagle3|eagle|medusa|dflash --k 3] [--max-tokens 32]

prompts.json: a list of token-id lists. out.json: {"outputs": [token ids per prompt],
"seconds", "tokens", "spec": {"drafts", "draft_tokens", "accepted", "per_position"} or null}.
"""

import argparse
import json
import time

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted",
}


def spec_counters(metrics) -> dict:
    from vllm.v1.metrics.reader import Counter, Vector

    found = {"per_position": None}
    for metric in metrics:
        if metric.name in SPEC_COUNTERS and isinstance(metric, Counter):
            found[SPEC_COUNTERS[metric.name]] = metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos" and isinstance(metric, Vector):
            found["per_position"] = list(metric.values)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--drafter")
    parser.add_argument("--method", choices=["eagle3", "eagle", "medusa", "dflash"])
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    speculative = (
        {"method": args.method, "model": args.drafter, "num_speculative_tokens": args.k}
        if args.drafter
        else None
    )
    llm = LLM(
        model=args.target,
        dtype="float32",
        max_model_len=2048,
        enforce_eager=True,
        seed=0,
        gpu_memory_utilization=0.15,  # on the CPU backend: the share of memory reserved for the KV cache
        disable_log_stats=False,
        speculative_config=speculative,
    )
    prompts = [{"prompt_token_ids": ids} for ids in json.load(open(args.prompts))]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=False)
    start = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    outputs = [list(r.outputs[0].token_ids) for r in results]
    out = {
        "outputs": outputs,
        "seconds": seconds,
        "tokens": sum(map(len, outputs)),
        "spec": spec_counters(llm.get_metrics()) if args.drafter else None,
    }
    with open(args.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
