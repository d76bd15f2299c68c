"""Run the numerics-sensitive tests once under every kernel set this CPU can be capped to.

PyTorch picks its CPU kernels per process: ATen's vectorised kernels by `ATEN_CPU_CAPABILITY`
(default | avx2 | avx512), oneDNN's (bf16 matmuls, packed linear layers, int8) by
`ONEDNN_MAX_CPU_ISA`, MKL's GEMMs by `MKL_ENABLE_INSTRUCTIONS`. Capping them runs this host as a
host of another kind, at full speed; `NMT_HOST_WITHOUT` presets take nmt's own fast paths away
(nmt.hw.host). Each kind runs the tests marked `learning`, `invariance`, `precision` and `int8` in a
fresh pytest process, with a probe cache of its own, and the table says which groups passed.

    python scripts/test_kinds.py                     # every kind this host has, seed 1 (make test-kinds)
    python scripts/test_kinds.py --seeds 1,2,3 --groups learning   # the spread each bound is set from
    python scripts/test_kinds.py --list              # the kinds, and why any is left out

With --seeds, every figure a learning test checks (tests/learning.py) is collected and printed as
its lowest and highest value per kind over the seeds, beside its bound. Exit status 1 if a test
failed under any kind.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GROUPS = ("learning", "invariance", "precision", "int8")


@dataclass(frozen=True)
class Kind:
    """A kernel set: its name, the environment that caps PyTorch (and nmt) to it, and the CPU
    flags it needs (a cap above what the CPU has is not a kind of this host)."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    needs: frozenset[str] = frozenset()


AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
KINDS = (
    Kind("native"),
    Kind("aten-default", {"ATEN_CPU_CAPABILITY": "default"}),
    Kind("aten-avx2", {"ATEN_CPU_CAPABILITY": "avx2"}, frozenset({"avx2"})),
    Kind("aten-avx512", {"ATEN_CPU_CAPABILITY": "avx512"}, AVX512),
    Kind("onednn-avx2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, frozenset({"avx2"})),
    Kind("onednn-avx512", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, AVX512),
    Kind("onednn-avx512-bf16", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, AVX512 | {"avx512_bf16"}),
    Kind("onednn-amx", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, AVX512 | {"amx_bf16", "amx_tile"}),
    # An AVX2-only host as far as one process can be made one: every library capped at once.
    Kind(
        "avx2-host",
        {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
        frozenset({"avx2"}),
    ),
    Kind("without-avx2-only", {"NMT_HOST_WITHOUT": "avx2-only"}),
    Kind("without-no-avx2", {"NMT_HOST_WITHOUT": "no-avx2"}),
    Kind("without-aarch64", {"NMT_HOST_WITHOUT": "aarch64"}),
)
# Not a kind: NMT_HOST_WITHOUT=bare also takes away the bf16 matmul every PyTorch CPU build runs
# (emulated where not native), which no real host lacks; 8 tests of the bf16/int8 paths assume it.


def cpu_flags() -> frozenset[str]:
    """The flags /proc/cpuinfo lists for the first CPU (empty where there is no such file)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return frozenset()
    return next((frozenset(ln.split(":", 1)[1].split()) for ln in lines if ln.startswith("flags")), frozenset())


def host_kinds(flags: frozenset[str]) -> tuple[list[Kind], list[tuple[Kind, str]]]:
    """The kinds this CPU can run, and the others with the flags they miss."""
    ok, left_out = [], []
    for kind in KINDS:
        missing = kind.needs - flags
        if missing:
            left_out.append((kind, "needs " + ", ".join(sorted(missing))))
        else:
            ok.append(kind)
    return ok, left_out


def run_kind(kind: Kind, seed: int, groups: tuple[str, ...], work: Path, extra: list[str]) -> dict:
    """One pytest process of the `groups` tests under `kind` and training seed `seed`; returns
    {"outcomes": [{nodeid, groups, outcome}], "learned": [figures], "seconds": wall time}."""
    tag = f"{kind.name}-seed{seed}"
    report, learned = work / f"{tag}.outcomes.jsonl", work / f"{tag}.learned.jsonl"
    env = {
        **os.environ,
        **kind.env,
        "NMT_KIND": kind.name,
        "NMT_TEST_SEED": str(seed),
        "NMT_KINDS_REPORT": str(report),
        "NMT_LEARNED_LOG": str(learned),
        "NMT_CACHE_DIR": str(work / f"{tag}.cache"),  # probes measured under this kind only
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", " or ".join(groups), *extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):  # 1: tests failed (counted below); else pytest itself could not run
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise SystemExit(f"{tag}: pytest exited {proc.returncode}:\n{tail}")
    if proc.returncode == 1:
        summary = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        print("\n".join(f"  {tag}: {ln}" for ln in summary), flush=True)
    return {"outcomes": _jsonl(report), "learned": _jsonl(learned), "seconds": seconds}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def outcome_cell(outcomes: list[dict], group: str) -> str:
    """'12 passed', '1 of 12 FAILED' or '-' for the tests of `group` in one run."""
    mine = [o for o in outcomes if group in o["groups"]]
    failed = sum(o["outcome"] == "failed" for o in mine)
    passed = sum(o["outcome"] == "passed" for o in mine)
    if not mine:
        return "-"
    return f"{failed} of {failed + passed} FAILED" if failed else f"{passed} passed"


def print_outcomes(results: dict[tuple[str, int], dict], groups: tuple[str, ...]) -> None:
    width = max(len(f"{k} seed {s}") for k, s in results) + 2
    print(f"\n{'kind':<{width}}" + "".join(f"{g:>16}" for g in groups) + f"{'seconds':>10}")
    for (kind, seed), res in results.items():
        cells = "".join(f"{outcome_cell(res['outcomes'], g):>16}" for g in groups)
        print(f"{f'{kind} seed {seed}':<{width}}{cells}{res['seconds']:>10.0f}")


def print_spread(results: dict[tuple[str, int], dict]) -> None:
    """Per learned figure and kind: lowest and highest over the seeds, and the bound."""
    rows: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    bounds: dict[str, tuple[float, bool]] = {}
    for (kind, _), res in results.items():
        for fig in res["learned"]:
            rows[(fig["name"], kind)].append(fig["value"])
            bounds[fig["name"]] = (fig["bound"], fig["above"])
    if not rows:
        return
    print(f"\n{'figure':<34}{'kind':<22}{'seeds':>6}{'lowest':>10}{'highest':>10}{'bound':>10}")
    for (name, kind), values in sorted(rows.items()):
        bound, above = bounds[name]
        print(
            f"{name:<34}{kind:<22}{len(values):>6}{min(values):>10.4g}{max(values):>10.4g}"
            f"{('> ' if above else '< ') + f'{bound:g}':>10}"
        )
    for name in sorted(bounds):
        values = [v for (n, _), vs in rows.items() if n == name for v in vs]
        bound, above = bounds[name]
        worst = min(values) if above else max(values)
        print(f"{name}: worst {worst:.4g} over {len(values)} runs, bound {bound:g}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1", help="training seeds, comma-separated (NMT_TEST_SEED)")
    parser.add_argument("--groups", default=",".join(GROUPS), help="test markers to run, comma-separated")
    parser.add_argument("--kinds", default="", help="only these kinds, comma-separated (default: all this host has)")
    parser.add_argument("--list", action="store_true", help="print the kinds and exit")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --), e.g. a test path")
    args = parser.parse_args(argv)
    kinds, left_out = host_kinds(cpu_flags())
    if args.kinds:
        wanted = args.kinds.split(",")
        unknown = set(wanted) - {k.name for k in KINDS}
        if unknown:
            parser.error(f"--kinds: unknown {', '.join(sorted(unknown))} (one of {', '.join(k.name for k in KINDS)})")
        kinds = [k for k in kinds if k.name in wanted]
    if args.list:
        for kind in kinds:
            print(f"{kind.name:<22}{' '.join(f'{k}={v}' for k, v in kind.env.items())}")
        for kind, why in left_out:
            print(f"{kind.name:<22}not on this CPU: {why}")
        return 0
    groups = tuple(g for g in args.groups.split(",") if g)
    if bad := set(groups) - set(GROUPS):
        parser.error(f"--groups: unknown {', '.join(sorted(bad))} (one of {', '.join(GROUPS)})")
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"CPU kinds of this host: {', '.join(k.name for k in kinds)}", flush=True)
    if left_out:
        print(f"not on this CPU: {', '.join(f'{k.name} ({why})' for k, why in left_out)}", flush=True)
    results: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory(prefix="nmt-kinds-") as tmp:
        for kind in kinds:
            for seed in seeds:
                results[(kind.name, seed)] = res = run_kind(kind, seed, groups, Path(tmp), args.pytest_args)
                print(f"{kind.name} seed {seed}: {len(res['outcomes'])} tests in {res['seconds']:.0f} s", flush=True)
    print_outcomes(results, groups)
    if len(seeds) > 1 or "learning" in groups:
        print_spread(results)
    counts = collections.Counter(o["outcome"] for res in results.values() for o in res["outcomes"])
    print(f"test-kinds: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
