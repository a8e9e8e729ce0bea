"""What the speculative loop costs beyond the target when it drafts nothing: the shipped head's
decoder under a policy that never drafts, against the plain loop, on the same prompts,
interleaved; at T=0 and T=1. A ratio of 1.00 means a round that drafts nothing costs exactly a
plain step (issue 15).

    OMP_NUM_THREADS=1 taskset -c 1 python docs/study/round_overhead.py [--reps 4]
"""

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from data.eval_sets import load_eval_set
from eval.decoder import ChainDrafting, SpeculativeDecoder
from eval.policies import StaticDraftLength
from eval.run import encode_turn, load_trained_head
from eval.verify import SamplingParams
from heads.machine import machine_line
from heads.target import Target, TargetConfig


@dataclass
class NeverDraft(StaticDraftLength):
    name: ClassVar[str] = "never"

    def start_round(self, context_tokens: int) -> bool:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", default="heads/release/smollm2-135m-eagle3")
    parser.add_argument("--reps", type=int, default=4, help="passes over the prompts (order alternates)")
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    target = Target.load(TargetConfig())
    head = load_trained_head(target, Path(args.head))
    prompts = [
        encode_turn(target, [], p.turns[0]) for task in ("mt_bench", "gsm8k") for p in load_eval_set(task, 3)
    ]
    decoder = SpeculativeDecoder(
        target.model,
        head,
        ChainDrafting(NeverDraft(4)),
        max(map(len, prompts)) + args.new_tokens + 16,
        eos_token_id=target.tokenizer.eos_token_id,
    )
    print(machine_line())
    for temperature in (0.0, 1.0):
        sampling = SamplingParams(temperature=temperature)
        seconds_per_token = {"plain": [], "never": []}
        for rep in range(args.reps):
            for prompt in prompts:
                for name in ("plain", "never") if rep % 2 == 0 else ("never", "plain"):
                    generator = torch.Generator().manual_seed(rep)
                    decode = decoder.generate_plain if name == "plain" else decoder.generate
                    start = time.perf_counter()
                    out = decode(prompt, args.new_tokens, sampling, generator)
                    seconds_per_token[name].append((time.perf_counter() - start) / len(out.tokens))
        plain, never = seconds_per_token["plain"], seconds_per_token["never"]
        ratio = statistics.median(n / p for n, p in zip(never, plain))
        print(
            f"T={temperature:g}: plain {1000 * statistics.median(plain):.2f} ms/token, never-drafting "
            f"decoder {1000 * statistics.median(never):.2f} ms/token; per-turn median ratio {ratio:.3f}"
        )


if __name__ == "__main__":
    main()
