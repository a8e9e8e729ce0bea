#!/usr/bin/env bash
# Quality per unit of compute (issue 13's goal): our EAGLE-3 trainer against speculators' own
# model, loss and optimizer at equal data and optimizer steps, both heads measured by our decoder
# on the same prompts (held-out chat + the three eval sets, T=0, chain K=4, AL only).
# Ours is the ablations' `base` run (docs/study/ablations.sh: STEPS steps of 4 rows <= 1024 tokens
# of the shipped replies); the peer trains on the same prepared train split, the same number of
# steps, each step one packed row of the tokens ours saw per step on average.
#   CORE=1 STEPS=50 bash docs/study/peer_compare.sh
source docs/study/common.sh
STEPS=${STEPS:-50}
CORE=${CORE:-1}
PEER_PY=${PEER_PY:-$HOME/.cache/peer-venv/bin/python}
DATA=$(grep -m1 '^data: ' outputs/study/abl_base.train.log | cut -d' ' -f2)/dataset
TOKENS=$(grep -o '"tokens": [0-9]*' outputs/study/abl_base/val_metrics.jsonl | tail -1 | grep -o '[0-9]*$')
ROW=$(( TOKENS / STEPS ))
echo "peer: $STEPS steps of $ROW tokens (ours: $TOKENS tokens in $STEPS steps) from $DATA"
OMP_NUM_THREADS=1 taskset -c "$CORE" "$PEER_PY" docs/study/peer_quality.py --data "$DATA" --steps "$STEPS" \
  --row-tokens "$ROW" --ttt 4 --out outputs/study/peer_head ${PEER_ARGS:-} > outputs/study/peer_head.train.log 2>&1
echo "peer trained $(date +%T)"
$PY -m heads.export import --format speculators --path outputs/study/peer_head \
  --target smollm2-135m-instruct --out outputs/study/peer_imported > outputs/study/peer_imported.log 2>&1
for run in peer_imported abl_base; do
  head=outputs/study/$run; [[ $run == abl_base ]] && head=$head/head
  OMP_NUM_THREADS=1 taskset -c "$CORE" bash -c "source docs/study/common.sh; evalhead $head outputs/study/${run}_eval \
    eval.prompts_per_task=6 eval.baselines=false" > outputs/study/${run}_eval.log 2>&1
  echo "$run evaluated $(date +%T)"
done
