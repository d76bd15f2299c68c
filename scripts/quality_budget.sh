#!/usr/bin/env bash
# Quality at a budget: train configs/small.yaml for a budget of training-loop wall time
# (train.max_time: updates, validation and checkpoint writes; not download/vocab/select/eval),
# average the last checkpoints, keep the better of averaged/best on the validation split, then
# evaluate beam search on the Tatoeba test and print BLEU/chrF overall and per script code.
#
#   scripts/quality_budget.sh            # 20 minutes
#   scripts/quality_budget.sh 5m         # a shorter budget
#   CONFIG=configs/small.yaml RUN=runs/q20 MIRROR=../shared/data scripts/quality_budget.sh 20m
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET=${1:-20m}
CONFIG=${CONFIG:-configs/small.yaml}
RUN=${RUN:-runs/budget-${BUDGET}}
MIRROR=${MIRROR:-../shared/data}
NMT=${NMT:-.venv/bin/nmt}
shift || true
start=$(date +%s)
"$NMT" pipeline --config "$CONFIG" --run "$RUN" --mirror "$MIRROR" --set "train.max_time=$BUDGET" "$@"
echo "total wall time (download, vocab, train, select, eval): $(( $(date +%s) - start )) s"
cat "$RUN/eval/test.md"
