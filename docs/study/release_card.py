"""README.md for the shipped head, from its eval report and the fine-tuning run's manifests.

python docs/study/release_card.py outputs/ft_more outputs/eval_ft_more/report.json <out README> [<eval commit>]
"""

import json
import subprocess
import sys
from pathlib import Path

run, report_path, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
r = json.loads(report_path.read_text())
val = [json.loads(line) for line in (run / "val_metrics.jsonl").read_text().splitlines()]
start, end = val[0], val[-1]  # step 0: the head stage 2 started from
assets = {
    name: json.loads(Path(f"data/assets/{name}.json").read_text())["shipped"]["sha256_uncompressed"]
    for name in ("smollm2_sharegpt_replies", "smollm2_sharegpt_replies_more")
}
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

An EAGLE-3 drafter for the embedded target (`smollm2-135m-instruct`), trained on this repository's
2-core CPU in two stages, 16k draft vocabulary, TTT 4, offline hidden states, bf16 autocast, a
jointly trained confidence head; weights stored in bf16.

1. 280 steps of 4 rows (<= 1024 tokens): 2 epochs of the target's own greedy replies to ShareGPT
   conversations 0-637 (`data/assets/smollm2_sharegpt_replies.jsonl.gz`, sha256 of the uncompressed
   file `{assets["smollm2_sharegpt_replies"]}`), lr 1e-3 cosine (commit bc508d6, BENCHMARKS.md
   "Recipe study"):

       python train/run.py run_dir=outputs/study/lc stages=[prepare,train] data.sources=[smollm2_replies] \\
           data.max_conversations=null data.max_length=1024 data.val_fraction=0.05 train=recipe \\
           train.hidden_states=offline train.precision=bf16 train.ttt_steps=4 train.batch_size=4 \\
           train.max_steps=280 train.lr=1e-3 train.warmup_steps=20 train.snapshot_every=50

2. 100 more steps, one pass over the replies to conversations 638-1095, which stage 1 never saw
   (`data/assets/smollm2_sharegpt_replies_more.jsonl.gz`, sha256
   `{assets["smollm2_sharegpt_replies_more"]}`), lr 5e-4 (warm-up 10, cosine to 0), from the stage-1
   head (commit 164c6d8's trainer, BENCHMARKS.md "Session 12"):

       python train/run.py run_dir=outputs/ft_more stages=[prepare,train] data=smollm2_replies_all \\
           data.sources=[smollm2_replies_more] train=cpu_recipe data.regenerate.enabled=false \\
           head.init=release train.max_steps=100 train.lr=5e-4 train.warmup_steps=10 \\
           train.precision=bf16 train.snapshot_every=25 train.val_every=25 train.checkpoint_every=25

Teacher-forced acceptance on stage 2's 21 held-out conversations (trained on by neither
stage), drafts 1 / 2 / 3 / 4: stage 1 {" / ".join(f"{start[f'val/acc_{k}']:.1%}" for k in range(4))},
after stage 2 {" / ".join(f"{end[f'val/acc_{k}']:.1%}" for k in range(4))}.

Eval (`python eval/run.py head_dir=heads/release/smollm2-135m-eagle3 ...`, docs/study/common.sh's
`evalhead`: T=0, chain K=4, static, {settings["prompts_per_task"]} prompts per task, {settings["max_new_tokens"]} new tokens
per turn, fp32 target; heldout_chat = first turns of ShareGPT conversations no run trained on;
commit {commit}):

| task | AL | acceptance of draft 1 | of draft 2 |
|---|---|---|---|
{chr(10).join(rows)}
| overall | {o["acceptance_length"]:.3f} | {o["acceptance_by_position"][0]:.1%} | {o["acceptance_by_position"][1]:.1%} |

Greedy output identical to plain decoding: {r.get("greedy_mismatches")} mismatches. Speed against plain
decoding on this CPU: BENCHMARKS.md (below break-even at T=0 with a static chain; expected_gain
and hybrid drafting decide per round whether drafts pay).

Use: `python eval/run.py head_dir=heads/release/smollm2-135m-eagle3 out=outputs/eval`, or start a job from
it with `head.init=release` (the default job does); export it with `python -m heads.export`.
Replace it when a recipe beats it on held-out conversations.
"""
out.write_text(text)
print(text)
