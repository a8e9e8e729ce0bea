#!/usr/bin/env bash
# bash eval/gpu_check.sh [HEAD_DIR]      (one GPU, about 5 minutes; run from the repo root)
# The decoder's GPU check: CUDA-graph and Triton-kernel tests on the device, then the decoding
# benchmark on CUDA at T=0 and T=1 with CUDA graphs, and at T=0 without them (same run dir,
# so the graphs' gain is the ratio of the two tables' tokens/s).
set -euo pipefail
HEAD=${1:-outputs/eagle3/head}
OUT=${OUT:-outputs/gpu_check}
PY=${PY:-.venv/bin/python}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
TRITON_INTERPRET=0 "$PY" -m pytest -q tests/eval/test_cuda_graphs.py tests/kernels
"$PY" eval/bench.py --head "$HEAD" --out "$OUT/graphs" --prompts-per-task 4 --max-new-tokens 128 \
    --settings static:4 confidence:8 --temperatures 0 1
"$PY" eval/bench.py --head "$HEAD" --out "$OUT/eager" --prompts-per-task 4 --max-new-tokens 128 \
    --settings static:4 --temperatures 0 --no-cuda-graphs
"$PY" -m eval.bench_decoder    # decoder rounds with and without the Triton kernels (8B-shape target)
# FSDP (accelerate turns it on only for CUDA ranks, so the CPU suite cannot run it): the config
# users launch, one rank, stopped at step 4 and resumed to 8; the run must end with a head.
FSDP_RUN="$OUT/fsdp"
rm -rf "$FSDP_RUN"
for stop in 4 0; do
    "$PY" -m accelerate.commands.launch --config_file conf/accelerate/fsdp.yaml --num_processes 1 \
        train/run.py head.init=random data.max_conversations=64 data.max_length=256 train.max_steps=8 \
        train.stop_at_step=$stop train.checkpoint_every=4 wandb.mode=disabled "stages=[prepare,train]" \
        run_dir="$FSDP_RUN"
done
test -f "$FSDP_RUN/head/model.safetensors" && grep -q "resumed from" "$FSDP_RUN/run.log" && echo "fsdp: trained, resumed, saved"
