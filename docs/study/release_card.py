"""README.md for a head trained by docs/study/gpu_recipe.sh (the session-19 head), from its eval report
and the training run's validation metrics. The session-23 card was written by hand.

python docs/study/release_card.py <training pack dir> <eval report.json> <out README> [<eval commit>]

The pack is what docs/study/gpu_recipe.sh brings back from the device (val_metrics.jsonl, logs).
"""

import json
import subprocess
import sys
from pathlib import Path

pack, report_path, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
r = json.loads(report_path.read_text())
end = [json.loads(line) for line in (pack / "val_metrics.jsonl").read_text().splitlines()][-1]
replies = json.loads(Path("data/assets/smollm2_sharegpt_replies_h200.json").read_text())["shipped"]
head_commit = subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
).stdout.strip()
commit = sys.argv[4] if len(sys.argv) > 4 else head_commit  # the code the eval ran
rows = [
    f"| {task} | {s['acceptance_length']:.3f} | {s['acceptance_by_position'][0]:.1%} | "
    f"{s['acceptance_by_position'][1]:.1%} |"
    for task, s in r["task"].items()
]
o = r["overall"]
settings = r["settings"]
text = f"""# SmolLM2-135M-Instruct EAGLE-3 head (shipped)

An EAGLE-3 drafter for the embedded target (`smollm2-135m-instruct`), trained on one NVIDIA H200
in 117 s: 314 steps of 32 rows (<= 1024 tokens, grouped by length), TTT 7, 16k draft vocabulary,
hidden states of the bf16 target computed online, bf16 autocast, AdamW lr 1e-3 (warm-up 16,
cosine to 0), a jointly trained confidence head; weights stored in bf16. BENCHMARKS.md
"Session 19" has the run's figures.

Data: the bf16 target's own greedy replies (regenerated on the same H200 in ~150 s) to the user
turns of the first ShareGPT conversations; the run trained on the first 640 of the 931 kept
(`data/assets/smollm2_sharegpt_replies_h200.jsonl.gz` holds all 931, sha256 of the uncompressed
file `{replies["sha256_uncompressed"]}`).

    MAX_CONV=640 BUDGET_S=500 bash docs/study/gpu_recipe.sh   # on the device: commit {replies["commit_made_at"]} + the script

which ran, for the training stage:

    python train/run.py stages=[prepare,train] target.device=cuda target.dtype=bfloat16 data=jsonl \\
        data.max_length=1024 data.sources=[<the replies>] data.val_fraction=0.02 train=cpu_recipe \\
        data.max_conversations=640 head.init=random train.hidden_states=online train.precision=bf16 train.ttt_steps=7 \\
        train.batch_size=32 train.lr=1e-3 train.max_steps=314 train.warmup_steps=16

Teacher-forced acceptance on the run's 13 held-out conversations, drafts 1-7:
{" / ".join(f"{end[f'val/acc_{k}']:.1%}" for k in range(7))}.

Eval (`python eval/run.py head_dir=heads/release/smollm2-135m-eagle3 ...`, docs/study/common.sh's
`evalhead`: T=0, chain K=4, static, {settings["prompts_per_task"]} prompts per task, {settings["max_new_tokens"]} new tokens
per turn, fp32 target on the 2-core CPU; heldout_chat = first turns of ShareGPT conversations
16,000-16,199, which no run trained on; commit {commit}):

| task | AL | acceptance of draft 1 | of draft 2 |
|---|---|---|---|
{chr(10).join(rows)}
| overall | {o["acceptance_length"]:.3f} | {o["acceptance_by_position"][0]:.1%} | {o["acceptance_by_position"][1]:.1%} |

It replaced the CPU-trained head of commit 0ac0e92 (two stages on the 2-core CPU, TTT 4, ~1.4M
training tokens in all), whose same eval gave AL 1.356 / 1.301 / 1.334 / 1.324 (gsm8k /
heldout_chat / humaneval / mt_bench), 1.327 overall, and draft-1 acceptance 24.9%.

Greedy output identical to plain decoding: {r.get("greedy_mismatches")} mismatches. Speed against plain
decoding on the 2-core CPU: BENCHMARKS.md "Session 19".

The device's transformers (5.17) converts the GGUF's tokenizer with eos_token `<|im_start|>`
where 5.24 says `<|im_end|>`, so the run recorded another tokenizer_hash; vocabulary, added
tokens and chat template are identical (checked), so the token ids are too, and `target.json`
names the embedded target and this repository's hash. Since session 20 that hash keys only what
decides the token ids (vocabulary, added tokens, chat template, a probe text's ids), not the
special tokens' names.

Use: `python eval/run.py head_dir=heads/release/smollm2-135m-eagle3 out=outputs/eval`, or start a job from
it with `head.init=release` (the default job does); export it with `python -m heads.export`.
Replace it when a recipe beats it on held-out conversations.
"""
out.write_text(text)
print(text)
