"""A head trained by speculators' own EAGLE-3 model, loss and optimizer, on our prepared rows.

Issue 13's quality-per-compute goal compares our head with one trained by the peer at equal data
and optimizer steps, both measured by our decoder. This script is the peer side; it runs in the
peer venv (../shared/peer/README.md), not the project's:

    PEER_MODEL=~/.cache/drafter/models/smollm2-135m-instruct ~/.cache/peer-venv/bin/python \
        docs/study/peer_quality.py --data ~/.cache/drafter/data/<key>/dataset --steps 50 \
        --row-tokens 3233 --ttt 4 --out outputs/study/peer_head

What is the peer's, unchanged: `Eagle3DraftModel.from_training_args` with speculators' CLI
defaults for an EAGLE-3 layer (norm_before_fc, norm_before_residual, norm_output, sliding window),
its draft vocabulary (`build_vocab_mappings_from_distribution` over the rows' assistant tokens),
its KL loss (eager; the fused one needs a GPU), its optimizer (`build_optimizers`: Muon on 2D
weights + AdamW, speculators' CLI defaults), its linear schedule with 1% warm-up, clip 1.0, and
its packing (documents concatenated into rows of --row-tokens, the overflowing one cut).
What is ours: the rows (our prepared train split, token ids and loss masks as our trainer reads
them), the number of steps and tokens per step, the target layers (the same three), and the
hidden states, produced by HF's forward of the same fp32 target as speculators' datagen would.
"""

import argparse
import json
import os
import random
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets
import torch
from speculators.losses.utils import resolve_loss_config
from speculators.models.eagle3 import Eagle3DraftModel
from speculators.train.cli import create_transformer_layer_config
from speculators.train.optimizers import build_optimizers
from speculators.train.trainer import TrainerConfig
from speculators.train.vocab_mapping import (
    build_vocab_mappings_from_distribution,
    save_token_frequency_distribution,
)
from transformers import AutoModelForCausalLM, get_linear_schedule_with_warmup

MODEL = os.path.expanduser(os.environ.get("PEER_MODEL", "~/.cache/drafter/models/smollm2-135m-instruct"))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="our prepared dataset directory (load_from_disk)")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument(
        "--row-tokens", type=int, required=True, help="tokens per optimizer step (one packed row)"
    )
    ap.add_argument("--ttt", type=int, default=4)
    ap.add_argument("--draft-vocab", type=int, default=16384)
    ap.add_argument(
        "--optimizer", default="muon", choices=["muon", "adamw"], help="speculators' CLI default: muon"
    )
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    return ap.parse_args()


def pack_rows(samples: list[tuple[list[int], list[int]]], row_tokens: int) -> list[list[tuple[int, int]]]:
    """speculators' collate: each document shifted (L -> L - 1 positions), concatenated into rows
    of exactly row_tokens; the document that overflows is cut and its remainder dropped."""
    rows, cur, used = [], [], 0
    for i, (ids, _) in enumerate(samples):
        n = len(ids) - 1
        if n <= 0:
            continue
        take = min(n, row_tokens - used)
        cur.append((i, take))
        used += take
        if used == row_tokens:
            rows.append(cur)
            cur, used = [], 0
    return rows


def vocab_maps(train: datasets.Dataset, draft_vocab: int, vocab_size: int):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "token_freq.pt")
        save_token_frequency_distribution(train.with_format("torch"), path)
        freq = torch.load(path, weights_only=True)
    return build_vocab_mappings_from_distribution(
        freq, draft_vocab_size=draft_vocab, target_vocab_size=vocab_size
    )


def main() -> None:
    a = parse_args()
    torch.manual_seed(a.seed)
    train = datasets.load_from_disk(a.data)["train"]
    samples = [(list(r["input_ids"]), list(r["loss_mask"])) for r in train]
    random.Random(a.seed).shuffle(samples)
    rows = pack_rows(samples, a.row_tokens)
    if len(rows) < a.steps:
        sys.exit(
            f"{len(samples)} documents pack into {len(rows)} rows of {a.row_tokens} tokens; {a.steps} asked"
        )
    rows = rows[: a.steps]

    target = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    n_layers = target.config.num_hidden_layers
    d2t, t2d = vocab_maps(train, a.draft_vocab, target.config.vocab_size)
    layer_cfg = create_transformer_layer_config(
        MODEL,
        num_layers=1,
        draft_arch="llama",
        hidden_act="silu",
        sliding_window=2048,
        full_attention_indices=[],
    )
    draft = Eagle3DraftModel.from_training_args(
        verifier_config=layer_cfg, t2d=t2d, d2t=d2t, verifier_name_or_path=MODEL, draft_vocab_size=a.draft_vocab,
        norm_before_residual=True, norm_before_fc=True, norm_output=True, fc_norm=False,
        embed_requires_grad=False, ttt_steps=a.ttt, draft_attn_impl="sdpa",
        target_layer_ids=[2, n_layers // 2, n_layers - 3],
    )  # fmt: skip
    draft.train()
    aux = draft.config.eagle_aux_hidden_state_layer_ids

    # vLLM / speculators datagen: aux id i = the input of decoder layer i; last = the final decoder
    # layer's output before model.norm (the draft applies the verifier's norm itself).
    captured = {}

    def hook(idx):
        def keep(_module, _inputs, output):
            captured[idx] = output[0] if isinstance(output, tuple) else output

        return keep

    for i in {x - 1 for x in aux} | {n_layers - 1}:
        target.model.layers[i].register_forward_hook(hook(i))

    def target_row(row):
        parts = {k: [] for k in ("hs", "last", "ids", "mask", "pos", "doc")}
        for d, (si, n) in enumerate(row):
            ids, mask = samples[si]
            x = torch.tensor([ids[: n + 1]])
            target.model(input_ids=x, use_cache=False)
            parts["hs"].append(torch.cat([captured[i - 1] for i in aux], -1)[:, :n])
            parts["last"].append(captured[n_layers - 1][:, 1 : n + 1])
            parts["ids"].append(x[:, 1 : n + 1])
            parts["mask"].append(torch.tensor([mask[1 : n + 1]]))
            parts["pos"].append(torch.arange(1, n + 1)[None])
            parts["doc"].append(torch.full((1, n), d))
        cat = {k: torch.cat(v, 1) for k, v in parts.items()}
        return dict(
            hidden_states=cat["hs"], verifier_last_hidden_states=cat["last"], input_ids=cat["ids"],
            loss_mask=cat["mask"], position_ids=cat["pos"], document_ids=cat["doc"],
        )  # fmt: skip

    config = TrainerConfig(lr=a.lr, num_epochs=1, save_path=a.out, optimizer=a.optimizer, muon_lr=a.lr)
    optimizers = build_optimizers(draft, config)
    schedulers = [get_linear_schedule_with_warmup(o, max(1, a.steps // 100), a.steps) for o in optimizers]
    loss_config = resolve_loss_config("kl_div", "eager")
    log, start, tokens = [], time.perf_counter(), 0
    for step, row in enumerate(rows, 1):
        with torch.no_grad():
            batch = target_row(row)
        _, loss, metrics = draft(**batch, ttt_steps=a.ttt, ttt_step_loss_decay=1.0, loss_config=loss_config)
        for o in optimizers:
            o.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        for o, s in zip(optimizers, schedulers):
            o.step()
            s.step()
        tokens += batch["input_ids"].shape[1]
        acc = [
            round((metrics[f"full_acc_{k}_sum"] / metrics[f"full_acc_{k}_total"]).item(), 4)
            for k in range(a.ttt)
        ]
        log.append({"step": step, "tokens": tokens, "loss": loss.item(), "train_acc": acc})
        print(
            f"step {step}/{a.steps} tokens {tokens} loss {loss.item():.3f} acc {acc} "
            f"({tokens / (time.perf_counter() - start):.0f} tokens/s)",
            flush=True,
        )
    draft.save_pretrained(a.out)
    with open(os.path.join(a.out, "peer_train_log.json"), "w") as f:
        json.dump({"args": vars(a), "model": MODEL, "steps": log}, f, indent=1)
    print(f"saved {a.out}: {a.steps} steps, {tokens} tokens in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
