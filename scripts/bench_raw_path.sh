#!/usr/bin/env bash
# The raw path (what exported runtimes do: no pass-through masks) of trained runs on the span sets
# of scripts/span_sets.py: `nmt eval --no-passthrough` (native engine, the run's beam), one run per
# core and one thread, two at a time; then a table of the spans kept per set.
#
#   python scripts/span_sets.py --out runs/spans
#   scripts/bench_raw_path.sh runs/spans runs/ablation/recipe runs/ablation/other
#
# Decide on valid, news40, mirror and mirror-words; the test set is there to report, never to decide on.
set -euo pipefail
cd "$(dirname "$0")/.."
SPANS=${1:?usage: bench_raw_path.sh SPANS_DIR RUN...}
shift
SETS=(valid news40 mirror mirror-words test)
NMT=${NMT:-.venv/bin/nmt}
CORES=$(nproc)
i=0
for run in "$@"; do
  args=()
  for s in "${SETS[@]}"; do args+=(--src "$SPANS/$s.zh" --ref "$SPANS/$s.en" --name "spans-$s"); done
  taskset -c $((i % CORES)) env OMP_NUM_THREADS=1 "$NMT" eval --run "$run" --engine native --no-passthrough \
    "${args[@]}" > "$run/raw-path.txt" 2>&1 &
  i=$((i + 1))
  if [ $((i % CORES)) = 0 ]; then wait; fi
done
wait
printf '%-28s' run; printf '%16s' "${SETS[@]}"; echo
for run in "$@"; do
  printf '%-28s' "$(basename "$run")"
  # one "pass-through P% (K of N spans kept)" line per set, in the order of SETS
  grep -o 'pass-through [0-9.]*% ([0-9]* of [0-9]*' "$run/raw-path.txt" |
    awk '{gsub(/\(/, "", $3); printf "%16s", $2 " (" $3 ")"}'
  echo
done
