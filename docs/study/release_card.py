"""README.md for the shipped head, from the eval report and the run's manifests."""

import json
import subprocess
import sys
from pathlib import Path

run, report_path, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
r = json.loads(report_path.read_text())
val = [json.loads(line) for line in (run / "val_metrics.jsonl").read_text().splitlines()]
shipped = json.loads(Path("data/assets/smollm2_sharegpt_replies.json").read_text())["shipped"]
commit = subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
).stdout.strip()
rows = []
for task, s in r["task"].items():
    sp = s.get("speedup_vs_plain")
    rows.append(
        f"| {task} | {s['acceptance_length']:.3f} | {s['acceptance_by_position'][0]:.1%} | "
        f"{f'{sp:.2f}x' if sp else '-'} |"
    )
o = r["overall"]
text = f"""# SmolLM2-135M-Instruct EAGLE-3 head (shipped)

An EAGLE-3 drafter for the embedded target (`smollm2-135m-instruct`), trained on this repository's
2-core CPU: 280 steps of 4 rows (<= 1024 tokens), 2 epochs of the target's own greedy replies
(`data/assets/smollm2_sharegpt_replies.jsonl.gz`, sha256 of the uncompressed file
`{shipped["sha256_uncompressed"]}`), offline hidden states, bf16 autocast, TTT 4, lr 1e-3 cosine,
16k draft vocabulary, a jointly trained confidence head. Weights stored in bf16.

Made by (commit {commit}; the study's command, BENCHMARKS.md "Recipe study"):

    python train/run.py run_dir=outputs/study/lc stages=[prepare,train] data.sources=[<the shipped replies>] \\
        data.max_conversations=null data.max_length=1024 data.val_fraction=0.05 train=recipe \\
        train.hidden_states=offline train.precision=bf16 train.ttt_steps=4 train.batch_size=4 \\
        train.max_steps=280 train.lr=1e-3 train.warmup_steps=20 train.snapshot_every=50

`train=cpu_recipe` runs the same recipe with the regeneration included.

Eval (`python eval/run.py head_dir=heads/release/smollm2-135m-eagle3 ...`: T=0, chain K=4, static,
{r["settings"]["prompts_per_task"]} prompts per task, {r["settings"]["max_new_tokens"]} new tokens per turn,
fp32 target, 2-core Intel/AMX CPU; heldout_chat = first turns of ShareGPT conversations no run trained on):

| task | AL | first-draft acceptance | x plain decoding |
|---|---|---|---|
{chr(10).join(rows)}
| overall | {o["acceptance_length"]:.3f} | {o["acceptance_by_position"][0]:.1%} | {("{:.2f}x".format(o["speedup_vs_plain"])) if o.get("speedup_vs_plain") else "-"} |

Held-out teacher-forced acceptance at the end of training (its own 5% validation split): step 0
{val[-1]["val/acc_0"]:.1%}, step 1 {val[-1]["val/acc_1"]:.1%}. Greedy output identical to plain
decoding: {r.get("greedy_mismatches")} mismatches.

Use: `python eval/run.py head_dir=heads/release/smollm2-135m-eagle3 out=outputs/eval`, or start a job from
it with `head.init=release` (the default job does); export it with `python -m heads.export`.
"""
out.write_text(text)
print(text)
