"""The decoder beside kernels/bench.py: eval's speculative decoder per verification round, with
the kernels (DRAFTER_KERNELS=triton) and without (reference), on a random-weight target of
Llama-3-8B shape and a random EAGLE-3 head (heads/eagle3.py), both built on the device in the
benchmark dtype.

    python -m eval.bench_decoder [--dry-run] [--cuda-graphs]   # on a GPU; --dry-run: tiny CPU shapes

It lives in eval/ (kernels/ import nothing of eval/) and prints its table the way kernels/bench.py does.

Random weights accept almost no drafts, so a round is: draft the tree, one target forward over
it, verify, commit one token. Its floor is one read of the target's weights.
"""

import argparse
import datetime
import os
import time
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eval.decoder import SpeculativeDecoder, TreeDrafting
from eval.verify import SamplingParams
from heads.draft_vocab import DraftVocab
from heads.eagle3 import Eagle3Head
from kernels.bench import DRY_RUN_SIZES, GPU_SIZES, commit_id, format_table, measure_bandwidth
from kernels.bench_timing import Row
from kernels.registry import ENV_VAR

SAMPLINGS = {"greedy": SamplingParams(), "T=0.7 top-p 0.9": SamplingParams(temperature=0.7, top_p=0.9)}


@dataclass(frozen=True)
class DecoderSizes:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    draft_vocab: int
    trees: tuple[tuple[int, int, int], ...]  # (depth, top_k, budget) per tree shape
    prompt_len: int
    new_tokens: int  # per generate call; rounds = new_tokens - 1 when nothing is accepted
    runs: int  # timed generate calls per row, after one warm-up call


GPU_DECODER_SIZES = DecoderSizes(
    hidden=4096,
    layers=32,
    heads=32,
    kv_heads=8,
    intermediate=14336,
    vocab=128256,
    draft_vocab=32000,
    trees=((4, 4, 16), (6, 10, 60)),
    prompt_len=256,
    new_tokens=25,
    runs=2,
)
DRY_RUN_DECODER_SIZES = DecoderSizes(
    hidden=64,
    layers=4,
    heads=4,
    kv_heads=2,
    intermediate=128,
    vocab=256,
    draft_vocab=200,
    trees=((3, 3, 8),),
    prompt_len=16,
    new_tokens=5,
    runs=1,
)


def build_models(
    sizes: DecoderSizes, device: torch.device, dtype: torch.dtype
) -> tuple[LlamaForCausalLM, Eagle3Head]:
    """A random target of the given shape and a random EAGLE-3 head for it, created on `device`
    in `dtype` directly (an 8B model never exists in fp32 or on the host)."""
    config = LlamaConfig(
        hidden_size=sizes.hidden,
        num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads,
        num_key_value_heads=sizes.kv_heads,
        intermediate_size=sizes.intermediate,
        vocab_size=sizes.vocab,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    )
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            target = LlamaForCausalLM(config).eval()
            draft_vocab = DraftVocab.from_token_ids(torch.arange(sizes.draft_vocab), sizes.vocab)
            drafter = Eagle3Head.from_target(
                config, embed_weight=target.model.embed_tokens.weight, draft_vocab=draft_vocab
            ).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    return target, drafter.to(device)


def _time_rounds(decoder: SpeculativeDecoder, prompt: list[int], sizes: DecoderSizes, sampling, device):
    """-> (seconds per verification round, the last run's tokens, its acceptance length)."""
    seconds, rounds = 0.0, 0
    for run in range(sizes.runs + 1):  # run 0 warms up (and compiles the kernels)
        generator = torch.Generator(device=device).manual_seed(run)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        begin = time.perf_counter()
        out = decoder.generate(prompt, sizes.new_tokens, sampling, generator)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if run:
            seconds += time.perf_counter() - begin
            rounds += out.metrics.verification_rounds
    return seconds / rounds, out.tokens, out.metrics.acceptance_length


def decoder_rows(
    device, dtype, sizes: DecoderSizes, impls: list[str], bandwidth: float, cuda_graphs: bool = False
) -> list[Row]:
    target, drafter = build_models(sizes, device, dtype)
    weight_bytes = sum(param.numel() * param.element_size() for param in target.parameters())
    prompt = torch.randint(
        sizes.vocab, (sizes.prompt_len,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    rows = []
    previous = os.environ.get(ENV_VAR)
    try:
        for depth, top_k, budget in sizes.trees:
            for sampling_name, sampling in SAMPLINGS.items():
                drafting = TreeDrafting(depth=depth, top_k=top_k, budget=budget)
                shape = (
                    f"{sizes.layers}L h{sizes.hidden} V={sizes.vocab} {str(dtype).removeprefix('torch.')}, "
                    f"tree d{depth} k{top_k} n{budget}, {sampling_name}"
                    + (", CUDA graphs" if cuda_graphs else "")
                )
                tokens = {}
                for impl in impls:
                    os.environ[ENV_VAR] = impl
                    decoder = SpeculativeDecoder(
                        target,
                        drafter,
                        drafting,
                        max_len=sizes.prompt_len + sizes.new_tokens,
                        cuda_graphs=cuda_graphs,
                    )
                    seconds, tokens[impl], accept_length = _time_rounds(
                        decoder, prompt, sizes, sampling, device
                    )
                    check = f"AL {accept_length:.2f}"
                    if impl != "reference":
                        same = tokens[impl] == tokens["reference"]
                        check += ", same tokens as reference" if same else ", tokens DIFFER from reference"
                    rows.append(Row("decoder round", shape, impl, seconds, weight_bytes / bandwidth, check))
    finally:
        if previous is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = previous
    return rows


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny CPU shapes, torch references only")
    parser.add_argument(
        "--cuda-graphs", action="store_true", help="replay the decoder's forwards from CUDA graphs (GPU only)"
    )
    options = parser.parse_args(argv)
    if options.dry_run:
        device, dtype, sizes, impls = torch.device("cpu"), torch.float32, DRY_RUN_DECODER_SIZES, ["reference"]
        bandwidth_sizes, card = DRY_RUN_SIZES, "CPU (dry run: the harness only, not a measurement)"
    elif torch.cuda.is_available():
        device, dtype, sizes, impls = (
            torch.device("cuda"),
            torch.bfloat16,
            GPU_DECODER_SIZES,
            ["reference", "triton"],
        )
        bandwidth_sizes, card = GPU_SIZES, torch.cuda.get_device_name(device)
    else:
        raise SystemExit(
            "eval/bench_decoder.py needs a CUDA GPU; run `python -m eval.bench_decoder --dry-run` on CPU"
        )
    begin = time.monotonic()
    bandwidth = measure_bandwidth(device, bandwidth_sizes)
    graphs = options.cuda_graphs and device.type == "cuda"  # CPU forwards always run eagerly
    rows = decoder_rows(device, dtype, sizes, impls, bandwidth, cuda_graphs=graphs)
    report = (
        f"card: {card}; date: {datetime.date.today()}; commit: {commit_id()}; torch {torch.__version__}; "
        f"elapsed {time.monotonic() - begin:.0f} s\n{format_table(rows)}"
    )
    print(report)
    return report


if __name__ == "__main__":
    main()
