#!/usr/bin/env python
"""Load test of `nmt serve` against offline batch decoding of the same sentences, in one run.

1. Offline ceiling: this process loads the run's model with the same settings and translates
   all sentences in one `Translator.translate` call (length-sorted batches of decode.batch_size).
2. A real server (`python -m nmt serve --port 0`) on 127.0.0.1, loaded with the same settings.
3. For each concurrency C: C clients on one asyncio event loop in this process (each keeps its
   connection open, HTTP keep-alive),
   one sentence per request, pull the sentences from a shared list until it is used up or
   `--max-seconds` have passed.
4. Steps 3 and 1 again, `--rounds` times in all: on a shared machine one round's ratio moves by
   several points, so each round is compared with the faster offline run next to it (before
   or after) and the table gives the median round with the range.

Reported per level: sentences/s (answered / wall time), latency percentiles over all rounds,
errors (non-200 answers or answers that differ from the offline translation), and the server's
throughput as a share of offline, per wall second and per CPU second (the CPU time of the server
and its decoding processes vs this process's during the fastest offline run).

    python scripts/bench_serve.py /work/runs/small
    python scripts/bench_serve.py runs/small --sentences 512 --concurrency 1,8,32 --beam 5
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nmt.decode.evaluate import read_lines  # noqa: E402
from nmt.decode.options import InferenceOptions  # noqa: E402
from nmt.decode.translator import Translator  # noqa: E402
from nmt.run.layout import RunDir  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a trained run directory")
    p.add_argument("--input", type=Path, default=None, help="sentences (default: <run>/corpus/test.zh)")
    p.add_argument("--sentences", type=int, default=256, help="seeded sample of the input")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--max-seconds", type=float, default=120.0, help="per concurrency level")
    p.add_argument("--beam", type=int, default=None, help="default: decode.beam of the run")
    p.add_argument("--precision", default="auto")
    p.add_argument("--batch-wait-ms", type=float, default=5.0)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=0, help="the server's --workers (0: its default)")
    p.add_argument("--rounds", type=int, default=3, help="offline, then every level; repeated, medians reported")
    p.add_argument("--api", choices=sorted(APIS), default="ours", help="which request format the clients send")
    return p.parse_args()


@dataclass
class Level:
    clients: int
    latencies: list[float] = field(default_factory=list)  # seconds per answered request
    errors: int = 0  # non-200 or an answer that differs from the offline one
    sent: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the server process's CPU time during the level
    calls: int = 0  # the server's model calls during the level (GET /info)
    machine_busy: float = 0.0  # share of all cores' time busy during the level (server, clients, anything else)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "nmt", "serve", "--run", str(args.run), "--port", "0", "--precision", args.precision,
           "--batch-wait-ms", str(args.batch_wait_ms), "--max-batch", str(args.max_batch),
           "--workers", str(args.workers), "--log-level", "warning"]  # fmt: skip
    if args.beam:
        cmd += ["--beam", str(args.beam)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    line = ""
    while "http://127.0.0.1:" not in line and proc.poll() is None:  # after the model's loading messages
        line = proc.stdout.readline()
    if "http://127.0.0.1:" not in line:
        proc.kill()
        sys.exit(f"server did not start: {line}")
    port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain: a full pipe would block the server
    for _ in range(600):
        try:
            if post(port, "/health", None)[0] == 200:
                return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("server never became healthy")


def post(port: int, path: str, body: dict | None) -> tuple[int, dict]:
    """One request on a new connection (GET without a body): status and JSON answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        if body is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def model_calls(port: int) -> int:
    return post(port, "/info", None)[1]["batching"]["model_calls"]


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children (Linux /proc): the server and its
    decoding processes."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # not a process, or one that has just ended
        parents[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    tree, grown = {pid}, True
    while grown:  # add children until none is left out
        more = {child for child, (parent, _) in parents.items() if parent in tree} - tree
        tree, grown = tree | more, bool(more)
    return sum(parents[p][1] for p in tree if p in parents) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (Linux /proc/stat)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


# How a client asks for one sentence and reads its translation, per API of `nmt serve`.
APIS = {
    "ours": (lambda text: {"text": text}, lambda body: body["translations"][0]["text"]),
    "libretranslate": (lambda text: {"q": text, "source": "zh", "target": "en"}, lambda body: body["translatedText"]),
}
API = APIS["ours"]  # set from --api in main


def load_level(port: int, sentences: list[str], expected: list[str], clients: int, max_seconds: float) -> Level:
    """`clients` concurrent clients on one asyncio event loop (a light load generator: the clients
    share the machine with the server), each on its own kept-open connection."""
    return asyncio.run(_load_level(port, sentences, expected, clients, max_seconds))


async def _load_level(port: int, sentences: list[str], expected: list[str], clients: int, max_seconds: float) -> Level:
    level, cursor = Level(clients), iter(range(len(sentences)))
    deadline = time.perf_counter() + max_seconds

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline and (i := next(cursor, None)) is not None:
                level.sent += 1
                start = time.perf_counter()
                try:
                    status, body = await _post(reader, writer, API[0](sentences[i]))
                    ok = status == 200 and API[1](body) == expected[i]
                except (OSError, ValueError, KeyError, asyncio.IncompleteReadError):
                    ok = False
                level.latencies.append(time.perf_counter() - start)
                level.errors += not ok
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    level.seconds = time.perf_counter() - start
    return level


async def _post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: dict) -> tuple[int, dict]:
    """POST /translate on an open HTTP/1.1 connection; the answer's status and JSON body."""
    data = json.dumps(body).encode()
    head = "POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    length = next(int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.lower() == "content-length")
    return int(lines[0].split()[1]), json.loads(await reader.readexactly(length))


def offline_run(translator: Translator, sentences: list[str], beam: int | None) -> tuple[list[str], float, float]:
    """All sentences in one `translate` call (length-sorted batches): outputs, sentences/s, sentences/CPU-s."""
    start, cpu = time.perf_counter(), time.process_time()
    outputs = translator.translate(sentences, beam=beam)
    n = len(sentences)
    return outputs, n / (time.perf_counter() - start), n / (time.process_time() - cpu)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


@dataclass
class Offline:
    """One offline run of all the sentences (the ceiling)."""

    outputs: list[str]
    rate: float  # sentences/s
    cpu_rate: float  # sentences per CPU second


def measure_level(
    port: int, pid: int, sentences: list[str], expected: list[str], clients: int, seconds: float
) -> Level:
    """One load level, with the server's CPU time, model calls and the machine's busy share."""
    cpu, calls, machine = process_cpu_seconds(pid), model_calls(port), machine_busy_seconds()
    level = load_level(port, sentences, expected, clients, seconds)
    level.cpu_seconds = process_cpu_seconds(pid) - cpu
    busy, total = (b - a for a, b in zip(machine, machine_busy_seconds(), strict=True))
    level.machine_busy = busy / max(total, 1e-9)
    level.calls = model_calls(port) - calls
    return level


def run_rounds(args: argparse.Namespace, translator: Translator, sentences: list[str]) -> tuple[list, list, str]:
    """Offline, then every load level, `--rounds` times, and offline once more: the offline runs
    (rounds + 1), the levels of each round, and the server's batching settings."""
    offline = [Offline(*offline_run(translator, sentences, args.beam))]
    args.precision = str(translator.precision)  # 'auto' may resolve otherwise in the server (its threads differ)
    proc, port = start_server(args)
    rounds: list[list[Level]] = []
    try:
        post(port, "/translate", {"text": sentences[:8]})  # warm-up
        b = post(port, "/info", None)[1]["batching"]
        batching = f"{b['workers']} workers, batches <= {b['max_batch']} sentences, wait <= {b['max_wait_ms']:g} ms"
        for _ in range(args.rounds):
            levels = [int(c) for c in args.concurrency.split(",")]
            expected = offline[0].outputs
            rounds.append([measure_level(port, proc.pid, sentences, expected, c, args.max_seconds) for c in levels])
            offline.append(Offline(*offline_run(translator, sentences, args.beam)))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return offline, rounds, batching


def row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def print_table(offline: list[Offline], rounds: list[list[Level]], per_call: float) -> None:
    """Per level: counts summed over the rounds; rates and shares as the median round [lowest-highest],
    each round against the faster offline run next to it (before or after)."""
    head = ["clients", "answered", "errors", "sentences/s", "% of offline", "sentences/CPU-s", "% of offline"]
    print(row(head + ["p50 ms", "p95 ms", "p99 ms", "sentences per model call", "cores busy"]))
    print("|---:" * (len(head) + 5) + "|")
    best = max(offline, key=lambda o: o.rate)
    cells = ["offline batch", len(best.outputs), "–", f"{best.rate:.1f}", "100%", f"{best.cpu_rate:.1f}", "100%"]
    print(row(cells + ["–", "–", "–", f"{per_call:.1f}", "–"]))
    for i in range(len(rounds[0])):
        runs = [(r[i], max(offline[k], offline[k + 1], key=lambda o: o.rate)) for k, r in enumerate(rounds)]
        rates = [len(lv.latencies) / lv.seconds for lv, _ in runs]
        shares = [rate / o.rate for rate, (_, o) in zip(rates, runs, strict=True)]
        per_cpu = [len(lv.latencies) / max(lv.cpu_seconds, 1e-9) for lv, _ in runs]
        cpu_shares = [c / max(o.cpu_rate for o in offline) for c in per_cpu]
        latencies = [t for lv, _ in runs for t in lv.latencies]
        answered, sent = sum(len(lv.latencies) for lv, _ in runs), sum(lv.sent for lv, _ in runs)
        calls = sum(lv.calls for lv, _ in runs)
        cells = [runs[0][0].clients, f"{answered}/{sent}", sum(lv.errors for lv, _ in runs)]
        cells += [
            f"{statistics.median(rates):.1f}",
            _spread(shares),
            f"{statistics.median(per_cpu):.1f}",
            _spread(cpu_shares),
        ]
        cells += [f"{1000 * percentile(latencies, q):.0f}" for q in (50, 95, 99)]
        cells += [f"{answered / max(calls, 1):.1f}", f"{100 * statistics.mean(lv.machine_busy for lv, _ in runs):.0f}%"]
        print(row(cells))


def _spread(shares: list[float]) -> str:
    """'71% [66-75%]': the median and the range of shares; the median alone for one round."""
    median = f"{100 * statistics.median(shares):.0f}%"
    return median if len(shares) == 1 else f"{median} [{100 * min(shares):.0f}-{100 * max(shares):.0f}%]"


def main() -> None:
    args = parse_args()
    global API
    API = APIS[args.api]
    lines = read_lines(args.input or RunDir(args.run).corpus_file("test", "zh"))
    lines = [s for s in lines if s.strip()]
    sentences = random.Random(args.seed).sample(lines, min(args.sentences, len(lines)))
    translator = Translator.from_options(InferenceOptions(run_dir=args.run, precision=args.precision, beam=args.beam))
    translator.translate(sentences[:8], beam=args.beam)  # warm-up
    load = os.getloadavg()[0]
    offline, rounds, batching = run_rounds(args, translator, sentences)
    beam = args.beam or translator.config.decode.beam
    changed = sum(sum(a != b for a, b in zip(offline[0].outputs, o.outputs, strict=True)) for o in offline[1:])

    settings = (
        f"beam {beam}, {translator.engine.name} {translator.precision} on {translator.device}; server: {batching}"
    )
    print(f"# nmt serve load test, {time.strftime('%Y-%m-%d')}: {args.run} ({settings})")
    print(
        f"CPU: {cpu_model()} ({os.cpu_count()} logical cores, load average {load:.1f} at the start); "
        f"clients send the {args.api} API"
    )
    print(f"{len(sentences)} sentences, one per request; {args.rounds} rounds; offline runs (sentences/s): "
          f"{', '.join(f'{o.rate:.1f}' for o in offline)} (outputs that changed between them: {changed})")  # fmt: skip
    print(f"command: python scripts/bench_serve.py {' '.join(sys.argv[1:])}\n")
    per_call = len(sentences) / len(translator.batches(translator.encode_sources(sentences)))
    print_table(offline, rounds, per_call)
    lost = sum(lv.sent - len(lv.latencies) + lv.errors for levels in rounds for lv in levels)
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
