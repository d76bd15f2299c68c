#!/usr/bin/env python
"""The two kernels of `nmt.model.attention.step_attention`, side by side on decoding's shapes.

A decoding step attends twice per layer: self-attention (R rows, one query each, over the T
cached positions) and cross-attention (N sentences, their `beam` rows as the queries of one block,
over S source positions, with the padding bias). `step_attention` runs the fused
`scaled_dot_product_attention` kernel, or the written-out math for blocks of several queries once
there are `QUERY_BLOCKS_FOR_MATH` (sentence × head) blocks. This prints both kernels' time (median
of `--repeats`, interleaved) for each shape and which one `step_attention` picks, so the rule
can be checked on another CPU.

    python scripts/bench_step_attention.py --heads 4 --head-dim 64 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmt.hw import host  # noqa: E402
from nmt.model import attention  # noqa: E402

CROSS = [(n, beam, 20) for n in (1, 4, 8, 16, 32, 64) for beam in (1, 5)]  # (sentences, beam, source length)
SELF = [(r, t) for r in (1, 5, 64, 320) for t in (5, 20, 40)]  # (rows, cached positions)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    return p.parse_args()


def median_us(kernels: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median µs of each call, interleaved (the first three rounds are warm-up)."""
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for _ in range(repeats + 3):
        for name, call in kernels.items():
            start = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - start) * 1e6)
    return {name: statistics.median(t[3:]) for name, t in times.items()}


def row(kind: str, shape: str, q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None, repeats: int) -> str:
    us = median_us(
        {
            "fused": lambda: F.scaled_dot_product_attention(q, k, k, attn_mask=bias),
            "math": lambda: attention.step_attention_math(q, k, k, bias),
        },
        repeats,
    )
    blocks = q.numel() // (q.size(-1) * q.size(-2))
    fused, math, runs = us["fused"], us["math"], attention.step_kernel(q)
    return f"| {kind} | {shape} | {blocks} | {fused:.0f} | {math:.0f} | {fused / math:.2f} | {runs} |"


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    H, dk = args.heads, args.head_dim
    print(f"# step_attention kernels | CPU: {host.current().describe()} | torch {torch.__version__} | "
          f"threads={args.threads} | heads={H} head_dim={dk} | median of {args.repeats} | "
          f"QUERY_BLOCKS_FOR_MATH={attention.QUERY_BLOCKS_FOR_MATH}")  # fmt: skip
    print("\n| attention | shape | blocks | fused µs | written-out µs | fused / written-out | step_attention runs |")
    print("|---|---|---:|---:|---:|---:|---|")
    with torch.inference_mode():
        for n, beam, s in CROSS:
            q, k = torch.randn(n, H, beam, dk), torch.randn(n, H, s, dk)
            bias = torch.zeros(n, 1, 1, s)
            print(row("cross", f"{n} sentences × beam {beam}, {s} keys", q, k, bias, args.repeats))
        for r, t in SELF:
            cache = torch.randn(r, H, 2 * t, dk)[:, :, :t]  # a view of a cache with room, as decoding reads it
            print(row("self", f"{r} rows, {t} cached", torch.randn(r, H, 1, dk), cache, None, args.repeats))


if __name__ == "__main__":
    main()
