#!/usr/bin/env bash
# Pass-through with and without (issue 12): two runs of one config on the same corpus and the same
# wall-clock training budget, one after the other; then each scored on the Tatoeba test (beam of
# the config) and on newstest2018 (greedy) with BLEU, chrF and the pass-through score.
#
#   scripts/bench_passthrough.sh                 # 10 minutes each, runs/pt-{on,off}
#   ROOT=/work/runs/pt MIRROR=../shared/data scripts/bench_passthrough.sh 20m
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET=${1:-10m}
CONFIG=${CONFIG:-configs/small.yaml}
ROOT=${ROOT:-runs/pt}
MIRROR=${MIRROR:-../shared/data}
NMT=${NMT:-.venv/bin/nmt}
NEWS="$MIRROR/wmt-news-zh-en/test.jsonl"
declare -A KINDS=([on]="[latin,number,url,email,marked]" [off]="[]")
for mode in on off; do
  set_=(--set "train.max_time=$BUDGET" --set "data.passthrough=${KINDS[$mode]}")
  "$NMT" download --config "$CONFIG" --run "$ROOT-$mode" --mirror "$MIRROR" "${set_[@]}"
  "$NMT" vocab --config "$CONFIG" --run "$ROOT-$mode" "${set_[@]}"
  echo "== train $mode $(date -u +%T)"
  "$NMT" train --config "$CONFIG" --run "$ROOT-$mode" "${set_[@]}" --restart
done
if [ -f "$NEWS" ]; then  # newstest2018 as plain zh/en lines
  python3 -c 'import json,sys
rows=[json.loads(l)["translation"] for l in open(sys.argv[1],encoding="utf-8")]
for lang in ("zh","en"):
    open(sys.argv[2]+"."+lang,"w",encoding="utf-8").write("".join(" ".join(r[lang].split())+"\n" for r in rows))' \
    "$NEWS" "$ROOT-newstest2018"
fi
for mode in on off; do
  "$NMT" eval --run "$ROOT-$mode" --split test
  [ -f "$NEWS" ] && "$NMT" eval --run "$ROOT-$mode" --src "$ROOT-newstest2018.zh" --ref "$ROOT-newstest2018.en" --beam 1
  grep -h "step\b" "$ROOT-$mode/train.log" | tail -1
done
