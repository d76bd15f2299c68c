"""Output length against reference length, by reference length: where a model stops short.

    python scripts/length_ratio.py runs/small/eval/valid.hyp runs/small/corpus/valid.en

Prints one row per bucket of reference words (whitespace-split): sentences, and the ratio of
hypothesis words to reference words summed over the bucket (BLEU's brevity penalty is
exp(1 - 1/ratio) over the whole set when the ratio is below 1).
"""

from __future__ import annotations

import argparse
from itertools import pairwise
from pathlib import Path

EDGES = (3, 6, 9, 12, 15)  # a bucket holds references of [edge, next edge) words; the last is open


def bucket(words: int) -> int:
    """The index of the bucket of a reference of `words` words (0: fewer than EDGES[0])."""
    return sum(words >= e for e in EDGES)


def ratios(hyps: list[str], refs: list[str]) -> list[tuple[str, int, float]]:
    """(bucket label, sentences, hypothesis words / reference words) per non-empty bucket."""
    if len(hyps) != len(refs):
        raise SystemExit(f"{len(hyps)} hypotheses against {len(refs)} references")
    totals = [[0, 0, 0] for _ in range(len(EDGES) + 1)]
    for h, r in zip(hyps, refs, strict=True):
        t = totals[bucket(len(r.split()))]
        t[0], t[1], t[2] = t[0] + 1, t[1] + len(h.split()), t[2] + len(r.split())
    labels = [f"< {EDGES[0]}", *(f"{a}-{b - 1}" for a, b in pairwise(EDGES)), f">= {EDGES[-1]}"]
    return [(label, n, hw / rw) for label, (n, hw, rw) in zip(labels, totals, strict=True) if n and rw]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("hyp", type=Path)
    p.add_argument("ref", type=Path)
    a = p.parse_args(argv)
    rows = ratios(*(path.read_text(encoding="utf-8").splitlines() for path in (a.hyp, a.ref)))
    print("| reference words | sentences | output / reference words |")
    print("|---|---:|---:|")
    for label, n, ratio in rows:
        print(f"| {label} | {n:,} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
