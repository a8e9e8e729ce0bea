#!/usr/bin/env bash
# Training throughput and peak memory per rank for DDP, DeepSpeed ZeRO-2 and ZeRO-3 on two CPU
# ranks (one thread each), the embedded target, an EAGLE-3 head (BENCHMARKS.md "Distributed
# training"). Each strategy trains the same 16 steps of the shipped replies from a random head;
# the trainer's closing line per rank gives tokens/s (both ranks) and that rank's peak memory.
#   bash docs/study/distributed_bench.sh    # ~6 min on a 2-core CPU
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=outputs/study/distributed
mkdir -p "$out"
common=(head.init=random head.confidence=false data.max_conversations=96 data.max_length=512 data.val_fraction=0
        train.ttt_steps=4 train.batch_size=2 train.max_steps=16 train.warmup_steps=2 train.log_every=4
        train.checkpoint_every=1000 train.resume=never wandb.mode=disabled "stages=[prepare,train]")
launch=(.venv/bin/accelerate launch --num_processes 2 --main_process_port 0)
for strategy in ddp_cpu zero2 zero3; do
    env=(OMP_NUM_THREADS=1)
    [ "$strategy" = ddp_cpu ] && env+=(ACCELERATE_USE_CPU=true)
    env "${env[@]}" "${launch[@]}" --config_file "conf/accelerate/$strategy.yaml" train/run.py "${common[@]}" \
        run_dir="$out/$strategy" > "$out/$strategy.log" 2>&1
    echo "$strategy: $(grep -h 'rank [01]: steps' "$out/$strategy.log" | sed 's/.*\] - //' | tr '\n' ' ')"
done
