#!/usr/bin/env python
"""One-shot GPU check of the attention backends and the base model (< 5 minutes on one GPU).

1. parity: flash (bf16 autocast) vs the fp32 math reference, outputs and input gradients, for
   encoder self-, causal decoder self- and cross-attention with random padding, plus a small model;
   flash must be within 3× the error of math run in bf16 (+ a small floor). Also fully padded rows
   (finite) and incremental decoding vs teacher forcing.
2. attention benchmark: forward+backward time and peak memory of math / sdpa / flash at sequence
   lengths 32, 128, 512, 1024 with the batch sized to a fixed token count; flash twice: unpadding
   from the mask on the device, and with the batch's host-computed `Packing` (no host sync).
3. training throughput: configs/base.yaml model shape, 32k/32k vocabs, synthetic batches, bf16
   autocast, AdamW; tokens/s and MFU against the bf16 matmul peak measured in the same run. Every
   backend gets the batches' host packing (as the trainer passes it); on a GPU flash is one of them.

Exit status: 0 all good (or no CUDA device), 1 a parity/edge-case check failed or a section crashed.
`--cpu` runs the same code with tiny shapes on the CPU (sdpa stands in for flash) to test the script.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from nmt import PAD_ID  # noqa: E402
from nmt.config import ModelConfig, load_config  # noqa: E402
from nmt.model.attention import MultiHeadAttention  # noqa: E402
from nmt.model.flops import matmul_peak_flops, train_flops  # noqa: E402
from nmt.model.masks import Packing, lengths_to_padding_mask, packing_from_lengths  # noqa: E402
from nmt.model.transformer import Transformer, model_summary  # noqa: E402


class Ctx:
    """Run-wide settings: device, the backend under test, sizes, the time budget."""

    def __init__(self, cpu: bool, budget_s: float):
        self.cpu = cpu
        self.device = torch.device("cpu" if cpu else "cuda")
        self.fast = "sdpa" if cpu else "flash"  # the backend checked against math
        self.amp = torch.bfloat16
        self.start = time.perf_counter()
        self.budget_s = budget_s
        self.failures: list[str] = []

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def section(ctx: Ctx, title: str, fn: Callable[[Ctx], None]) -> None:
    print(f"\n=== {title} ({time.perf_counter() - ctx.start:.0f}s elapsed)", flush=True)
    try:
        fn(ctx)
    except Exception:
        traceback.print_exc()
        ctx.failures.append(f"{title}: crashed")
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()


def table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)), flush=True)


def random_pad(B: int, L: int, lo: int, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """(B, L) right padding, lengths uniform in [lo, L], row 0 full."""
    lengths = torch.randint(lo, L + 1, (B,), generator=gen)
    lengths[0] = L
    return lengths_to_padding_mask(lengths, L).to(device)


# --------------------------------------------------------------------------- 1. parity


def attention_run(mha, backend, x, memory, key_pad, query_pad, causal, amp):
    """Output (real query positions) and input gradients of a weighted sum over real positions."""
    mha.backend = backend
    x = x.detach().clone().requires_grad_(True)
    mem = None if memory is None else memory.detach().clone().requires_grad_(True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
        out = mha(x, mem, key_pad=key_pad, query_pad=query_pad, causal=causal)
    real = ~query_pad
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device)
    (out.float() * weights * real[..., None]).sum().backward()
    grads = [x.grad] + ([] if mem is None else [mem.grad])
    return [out.float()[real]] + [g.float() for g in grads]


def compare(ctx: Ctx, name: str, ref: list, fast: list, low: list, rows: list) -> None:
    for label, r, f, b in zip(["out", "d_x", "d_memory"], ref, fast, low, strict=False):
        scale = r.abs().max().item()
        err_f, err_b = (f - r).abs().max().item(), (b - r).abs().max().item()
        tol = 3 * err_b + 1e-3 * scale
        ok = bool(torch.isfinite(f).all()) and err_f <= tol
        rows.append([name, label, f"{scale:.3g}", f"{err_f:.3g}", f"{err_b:.3g}", f"{tol:.3g}", "ok" if ok else "FAIL"])
        if not ok:
            ctx.failures.append(f"parity {name} {label}: {ctx.fast} err {err_f:.3g} > tol {tol:.3g}")


def check_parity(ctx: Ctx) -> None:
    gen = torch.Generator().manual_seed(0)
    D, H = (64, 4) if ctx.cpu else (512, 8)
    B, T, S = 8, 96, 80
    mha = MultiHeadAttention(D, H).to(ctx.device)
    rows: list[list[str]] = []
    for name, cross, causal in [("encoder self", False, False), ("decoder self", False, True), ("cross", True, False)]:
        x = torch.randn(B, T, D, generator=gen).to(ctx.device)
        memory = torch.randn(B, S, D, generator=gen).to(ctx.device) if cross else None
        query_pad = random_pad(B, T, 1, ctx.device, gen)
        key_pad = random_pad(B, S, 1, ctx.device, gen) if cross else query_pad
        args = (x, memory, key_pad, query_pad, causal)
        ref = attention_run(mha, "math", *args, amp=False)
        fast = attention_run(mha, ctx.fast, *args, amp=True)
        low = attention_run(mha, "math", *args, amp=True)
        compare(ctx, name, ref, fast, low, rows)
    compare(ctx, "model logits", *model_parity(ctx, gen), rows)
    table([f"parity ({ctx.fast} vs fp32 math)", "tensor", "max|ref|", "err", "err math bf16", "tol", ""], rows)


def small_model(ctx: Ctx, backend: str) -> Transformer:
    cfg = ModelConfig(d_model=128, heads=4, encoder_layers=2, decoder_layers=2, ffn_dim=256, dropout=0.0)
    cfg.attention = backend
    return Transformer(cfg, 500, 600).to(ctx.device)


def set_backend(model: Transformer, backend: str) -> None:
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.backend = backend


def model_batch(ctx: Ctx, gen: torch.Generator, B: int, S: int, T: int):
    src = torch.randint(4, 500, (B, S), generator=gen)
    tgt = torch.randint(4, 600, (B, T), generator=gen)
    src.masked_fill_(random_pad(B, S, 2, torch.device("cpu"), gen), PAD_ID)
    tgt.masked_fill_(random_pad(B, T, 2, torch.device("cpu"), gen), PAD_ID)
    return src.to(ctx.device), tgt.to(ctx.device)


def ids_packing(ids: torch.Tensor) -> Packing:
    """The `Packing` of right-padded ids (B, L), built on the host from their lengths (read back once,
    outside the model, as a batch builder knows them) and moved to the ids' device."""
    return packing_from_lengths((ids != PAD_ID).sum(dim=1).tolist(), ids.size(1)).to(ids.device)


def model_parity(ctx: Ctx, gen: torch.Generator) -> tuple[list, list, list]:
    """Logits at real target positions: fp32 math, the fast backend and math in bf16."""
    model = small_model(ctx, "math").eval()
    src, tgt = model_batch(ctx, gen, 6, 40, 33)
    real = tgt != PAD_ID
    packing = (ids_packing(src), ids_packing(tgt))
    outs = []
    for backend, amp in [("math", False), (ctx.fast, True), ("math", True)]:
        set_backend(model, backend)
        with torch.no_grad(), torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=amp):
            outs.append([model(src, tgt, packing=packing).float()[real]])  # flash: the host packing
    return outs[0], outs[1], outs[2]


def check_edge_cases(ctx: Ctx) -> None:
    """Fully padded source/target rows stay finite (fast backend, training step); incremental
    decoding matches teacher forcing (fp32, default backend on this device)."""
    gen = torch.Generator().manual_seed(1)
    model = small_model(ctx, ctx.fast).train()
    src, tgt = model_batch(ctx, gen, 4, 20, 18)
    src[1], tgt[2] = PAD_ID, PAD_ID
    with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
        logits = model(src, tgt)
    logits.float().sum().backward()
    finite = bool(torch.isfinite(logits).all()) and all(
        torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None
    )
    print(f"fully padded rows with {ctx.fast}: {'finite' if finite else 'NaN/inf FOUND'}")
    if not finite:
        ctx.failures.append(f"edge: fully padded rows give non-finite values with {ctx.fast}")

    set_backend(model, "auto")
    model.eval()
    src, tgt = model_batch(ctx, gen, 5, 20, 15)
    with torch.no_grad():
        full = model(src, tgt)
        state = model.start_decoding(model.encode(src))
        state.reorder(torch.arange(5, device=ctx.device).repeat_interleave(2))  # expand ×2 like a beam
        steps = torch.stack([model.decode_step(tgt[:, t].repeat_interleave(2), state) for t in range(15)], 1)
    real = (tgt != PAD_ID).repeat_interleave(2, 0)
    err = (steps[real] - full.repeat_interleave(2, 0)[real]).abs().max().item()
    print(f"incremental decoding vs teacher forcing (fp32): max abs diff {err:.3g}")
    if not err < 1e-3:
        ctx.failures.append(f"edge: incremental decoding differs from teacher forcing by {err:.3g}")


# --------------------------------------------------------------------------- 2. attention benchmark


def time_fwd_bwd(ctx: Ctx, fn: Callable[[], torch.Tensor], iters: int) -> tuple[float, float]:
    """Milliseconds per forward+backward and peak memory (MiB) above the starting point."""
    for _ in range(2):
        fn().float().sum().backward()
    ctx.sync()
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if ctx.device.type == "cuda" else 0
    start = time.perf_counter()
    for _ in range(iters):
        fn().float().sum().backward()
    ctx.sync()
    ms = (time.perf_counter() - start) / iters * 1e3
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if ctx.device.type == "cuda" else float("nan")
    return ms, peak


def bench_attention(ctx: Ctx) -> None:
    gen = torch.Generator().manual_seed(2)
    D, H = (64, 4) if ctx.cpu else (512, 8)
    tokens = 256 if ctx.cpu else 32768
    lengths = (32, 64) if ctx.cpu else (32, 128, 512, 1024)
    backends = ["math", "sdpa", "flash", "flash+packing"] if not ctx.cpu else ["math", "sdpa"]
    mha = MultiHeadAttention(D, H).to(ctx.device)
    rows = []
    for causal in (False, True):
        for L in lengths:
            B = max(1, tokens // L)
            pad = random_pad(B, L, L // 2, ctx.device, gen)
            packing = packing_from_lengths((~pad).sum(dim=1).tolist(), L).to(ctx.device)  # once, outside timing
            x = torch.randn(B, L, D, device=ctx.device, requires_grad=True)
            row = ["decoder self (causal)" if causal else "encoder self", str(L), str(B)]
            for backend in backends:
                row.append(bench_one(ctx, mha, backend, x, pad, causal, packing))
            rows.append(row)
    table(["attention fwd+bwd, bf16", "len", "batch"] + [f"{b} ms / MiB" for b in backends], rows)
    print(f"(batch = {tokens} tokens / len; lengths uniform in [len/2, len]; d_model {D}, {H} heads)")


def bench_one(ctx: Ctx, mha: MultiHeadAttention, backend: str, x, pad, causal: bool, packing: Packing) -> str:
    """One timing cell; "flash+packing" is flash given the host packing (no unpadding on the device)."""
    if ctx.left() < 60:
        return "skipped (time)"
    mha.backend = backend.removesuffix("+packing")
    given = packing if backend.endswith("+packing") else None

    def fn() -> torch.Tensor:
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
            return mha(x, key_pad=pad, causal=causal, key_packing=given)

    try:
        ms, peak = time_fwd_bwd(ctx, fn, iters=3 if ctx.cpu else 10)
        return f"{ms:8.2f} / {peak:7.0f}"
    except torch.cuda.OutOfMemoryError:
        return "OOM"
    finally:
        x.grad = None
        mha.zero_grad(set_to_none=True)


# --------------------------------------------------------------------------- 3. training throughput


def synthetic_batch(gen: torch.Generator, max_tokens: int, max_len: int, vocab: int, device: torch.device):
    """A length-bucketed batch: lengths uniform in [0.75 max_len, max_len], B = max_tokens // max_len."""
    B = max(1, max_tokens // max_len)
    lo = max(2, int(0.75 * max_len))
    src_len = torch.randint(lo, max_len + 1, (B,), generator=gen)
    tgt_len = torch.randint(lo, max_len + 1, (B,), generator=gen)
    src = torch.randint(4, vocab, (B, max_len), generator=gen)
    tgt = torch.randint(4, vocab, (B, max_len + 1), generator=gen)
    src.masked_fill_(lengths_to_padding_mask(src_len, max_len), PAD_ID)
    tgt.masked_fill_(lengths_to_padding_mask(tgt_len + 1, max_len + 1), PAD_ID)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    src_packing = packing_from_lengths(src_len.tolist(), max_len)  # on the host, as the batch builder does
    tgt_packing = packing_from_lengths((tgt_len + 1).clamp(max=max_len).tolist(), max_len)  # real tokens of tgt_in
    packing = (src_packing.to(device), tgt_packing.to(device))
    return src.to(device), tgt_in.to(device), tgt_out.to(device), src_len.float(), tgt_len.float(), packing


def bench_training(ctx: Ctx) -> None:
    cfg = load_config(ROOT / "configs" / "base.yaml").model
    vocab = 32000
    if ctx.cpu:
        cfg.d_model, cfg.heads, cfg.ffn_dim, cfg.encoder_layers, cfg.decoder_layers = 64, 4, 128, 1, 1
        vocab = 1000
    n, repeats = (512, 2) if ctx.cpu else (8192, 20)
    peak = matmul_peak_flops(torch.bfloat16, n=n, repeats=repeats, device=ctx.device)
    print(f"measured bf16 matmul peak ({n}x{n}): {peak / 1e12:.3g} TFLOP/s")
    max_tokens = 512 if ctx.cpu else 8192  # train.max_tokens of base.yaml
    rows = []
    for backend in ["auto", "sdpa", "math"] + ([] if ctx.cpu else ["flash"]):
        for max_len in (32, 128) if not ctx.cpu else (32,):
            if ctx.left() < 30:
                rows.append([backend, str(max_len), "skipped (time)", "", "", ""])
                continue
            rows.append(train_row(ctx, cfg, backend, vocab, max_tokens, max_len, peak))
    table(["backend", "max len", "ms/step", "tokens/s (real tgt)", "TFLOP/s", "MFU"], rows)
    print(
        "(AdamW, label smoothing 0.1, grad clip 1.0, bf16 autocast; FLOPs = nmt.model.flops.train_flops on real tokens)"
    )


def train_row(ctx: Ctx, cfg: ModelConfig, backend: str, vocab: int, max_tokens: int, max_len: int, peak: float):
    torch.manual_seed(0)
    cfg.attention = backend
    with ctx.device:  # initialise on the device: fast for the 77M-parameter model
        model = Transformer(cfg, vocab, vocab).train()
    if backend == "auto" and max_len == 32:
        print(model_summary(model))
    fused = {"fused": True} if ctx.device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), **fused)
    gen = torch.Generator().manual_seed(3)
    batches = [synthetic_batch(gen, max_tokens, max_len, vocab, ctx.device) for _ in range(4)]

    def step(b) -> None:
        src, tgt_in, tgt_out = b[:3]
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
            logits = model(src, tgt_in, packing=b[5])
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), tgt_out.flatten(), ignore_index=PAD_ID, label_smoothing=0.1
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    try:
        for b in batches[:2]:
            step(b)
        ctx.sync()
        iters = 2 if ctx.cpu else 12
        start = time.perf_counter()
        for i in range(iters):
            step(batches[i % len(batches)])
        ctx.sync()
    except torch.cuda.OutOfMemoryError:
        return [backend, str(max_len), "OOM", "", "", ""]
    sec = (time.perf_counter() - start) / iters
    flops = tgt_tokens = 0.0
    for i in range(iters):
        s, t = batches[i % len(batches)][3:5]
        ns, nt = float(s.sum()), float(t.sum())
        flops += train_flops(cfg, ns, nt, float((s**2).sum()) / ns, float((t**2).sum()) / nt, vocab)
        tgt_tokens += nt
    rate = flops / iters / sec
    return [backend, str(max_len), f"{sec * 1e3:.1f}", f"{tgt_tokens / iters / sec:,.0f}", f"{rate / 1e12:.3g}",
            f"{rate / peak:.1%}"]  # fmt: skip


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="smoke-test this script on the CPU with tiny shapes")
    parser.add_argument("--budget", type=float, default=270.0, help="seconds before benchmarks are skipped")
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    ctx = Ctx(cpu=args.cpu, budget_s=args.budget)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference must be fp32
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__}, device: ", end="")
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        print(f"{props.name}, capability {props.major}.{props.minor}, {props.total_memory / 2**30:.0f} GiB")
    else:
        print("CPU smoke test (sdpa stands in for flash)")
    section(ctx, "1. parity", check_parity)
    section(ctx, "1b. edge cases", check_edge_cases)
    section(ctx, "2. attention benchmark", bench_attention)
    section(ctx, "3. training throughput (base.yaml shape)", bench_training)
    print(f"\ntotal {time.perf_counter() - ctx.start:.0f}s")
    if ctx.failures:
        print("FAILED:\n  " + "\n  ".join(ctx.failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
