"""Learned results checked against their bounds, and recorded for the spread across CPU kinds and seeds.

A test that asserts what a model learned (a BLEU, a loss, a count of solved sentences) depends on
the kernels PyTorch picks on this CPU and on the training seed. Such a test states its bound with
`assert_learned`, trains with `TEST_SEED` (``NMT_TEST_SEED``, default 1), and carries the marker
``learning``. `scripts/test_kinds.py --seeds 1,2,3` runs these tests under every kernel set the
host has and every seed, with ``NMT_LEARNED_LOG`` naming a file that collects each figure; it then
prints the spread (lowest, highest) per figure and kind, which is what each bound is set from.
"""

from __future__ import annotations

import json
import os

TEST_SEED = int(os.environ.get("NMT_TEST_SEED", "1"))
LOG = "NMT_LEARNED_LOG"


def assert_learned(name: str, value: float, bound: float, *, above: bool = True) -> None:
    """Assert `value` > `bound` (or < it with ``above=False``); with ``NMT_LEARNED_LOG`` set, first
    append {name, value, bound, seed, kind} as one JSON line to that file, so that a run over
    kinds and seeds sees every figure, also the ones that fail."""
    if path := os.environ.get(LOG):
        row = {"name": name, "value": float(value), "bound": bound, "above": above, "seed": TEST_SEED}
        row["kind"] = os.environ.get("NMT_KIND", "")
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    ok = value > bound if above else value < bound
    assert ok, f"{name}: {value:.4g} is not {'above' if above else 'below'} its bound {bound}"
