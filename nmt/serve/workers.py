"""Where a server's model runs: model workers, each driven by its own thread, in this process or a child.

An `InProcessWorker` holds one loaded `Translator` and does what the server asks of the model: decode
a group of lines (`decode`), draw a cross-attention map (`attention`), describe the model
(`facts`). `ModelWorkers` keeps `count` workers, each with one thread of this process that makes
its (blocking) calls, and gives each call to an idle worker.

- One worker (`ModelWorkers.in_process`): it lives in this process and is loaded on its
  thread, so all model work runs on one thread. PyTorch's CPU ops run on an OpenMP team that
  belongs to the calling thread: a model loaded on one thread and used on another brought a
  second team onto the cores, and each small op of a decoding step then paid a wake-up
  (measured in docs/BENCHMARKS.md, "Serving under load").
- Several workers (`ModelWorkers.in_children`): each worker lives in a child process (`ChildWorker`
  is its proxy here, with the same methods) and decodes with cores // workers intra-op threads.
  Processes rather than threads because PyTorch holds Python's GIL between its ops, so model
  threads in one process wait for each other and for the HTTP event loop. The batches of a
  server are small and unsorted, and a step of a small batch is mostly fixed cost that a second
  intra-op thread does not share, so two 1-thread workers beat one 2-thread worker (both
  comparisons measured in docs/BENCHMARKS.md, "Serving under load").

A child ignores SIGINT and SIGTERM (the server stops it once the requests in flight are
answered) and exits when its pipe closes, so it never outlives the server. A child that dies
is replaced by a new one, which is asked the call again (once: a call that kills two children
fails). Children are spawned (a fresh interpreter, not a fork of a process with threads), so a
script of one's own that starts them needs Python's `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import multiprocessing
import pickle
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from nmt.decode.options import InferenceOptions
from nmt.serve.batcher import Decoding, Hypotheses, LineDone


@dataclass(frozen=True)
class ModelFacts:
    """What the server says about its model (the worker's translator, in plain values)."""

    config: Any  # nmt.config.Config
    checkpoint: str | None
    engine: str
    precision: str
    device: str
    src_vocab: int
    tgt_vocab: int
    attention_maps: bool  # a PyTorch model (its own or its checkpoint's) whose attention can be read
    threads: int  # PyTorch intra-op threads the worker decodes with


class Worker(Protocol):
    def facts(self) -> ModelFacts: ...
    def decode(self, lines: list[str], settings: Decoding, on_line: LineDone | None = None) -> list[Hypotheses]: ...
    def attention(self, text: str, target: str, layer: int | None) -> dict[str, Any]: ...
    def close(self) -> None: ...


class InProcessWorker:
    """A loaded `Translator` (nmt.decode.translator) and the model work of a server, run where it lives."""

    def __init__(self, translator: Any) -> None:
        import torch

        self.translator = translator
        self.threads = getattr(translator.engine, "threads", 0) or torch.get_num_threads()  # CTranslate2 keeps its own

    @classmethod
    def load(cls, opts: InferenceOptions, threads: int = 0) -> InProcessWorker:
        """Load `opts` (`InferenceOptions`); then `threads` intra-op threads if > 0 (after loading, so
        that an int8 kernel is chosen with the threads `nmt translate` has, and answers alike)."""
        import torch

        from nmt.decode.translator import Translator

        if threads > 0:
            opts = replace(opts, threads=threads)  # CTranslate2 takes its threads when it loads
        translator = Translator.from_options(opts)
        if threads > 0:
            torch.set_num_threads(threads)
        return cls(translator)

    def facts(self) -> ModelFacts:
        t = self.translator
        return ModelFacts(
            config=t.config,
            checkpoint=str(t.checkpoint) if t.checkpoint else None,
            engine=t.engine.name,
            precision=str(t.precision),
            device=str(t.device),
            src_vocab=t.src_tok.vocab_size,
            tgt_vocab=t.tgt_tok.vocab_size,
            attention_maps=t.model is not None or (t.checkpoint is not None and Path(t.checkpoint).is_file()),
            threads=self.threads,
        )

    def decode(self, lines: list[str], s: Decoding, on_line: LineDone | None = None) -> list[Hypotheses]:
        """Exactly `nmt translate`'s path: a beam of 1 without n-best runs greedy search (no score).
        `on_line(i, hypotheses)` hears of each line the beam search finishes before the group does."""
        if s.beam == 1 and s.nbest == 1:
            texts = self.translator.translate(lines, 1, 1, s.len_penalty)
            return [[(t, None)] for t in texts]
        report = (lambda i, pairs: on_line(i, _scored(pairs))) if on_line is not None else None
        found = self.translator.translate_nbest(lines, s.beam, s.nbest, s.len_penalty, report)
        return [_scored(pairs) for pairs in found]

    def attention(self, text: str, target: str, layer: int | None) -> dict[str, Any]:
        """`nmt.serve.attention_map.attention_map` as JSON-ready values."""
        from nmt.serve.attention_map import attention_map

        return attention_map(self.translator, text, target, layer).to_dict()

    def close(self) -> None:
        pass


def _scored(pairs: list[tuple[str, float]]) -> Hypotheses:
    return [(t, float(score)) for t, score in pairs] or [("", None)]


# --------------------------------------------------------------------------- a worker in a child process


class WorkerDied(RuntimeError):
    """The child process of a worker ended while it was asked something."""


class ChildWorker:
    """An `InProcessWorker` loaded in a spawned child process, with the same methods (each blocks until the
    child answers; `decode` passes on the child's early lines to `on_line`)."""

    def __init__(self, opts: InferenceOptions, threads: int, quiet: bool = False) -> None:
        """Starts the child; `facts()` waits until it has loaded (and raises what loading raised).
        `quiet`: the child's loading messages (stderr) are dropped (its siblings' say the same)."""
        self.opts, self.threads, self.quiet = opts, threads, quiet
        self._facts: ModelFacts | None = None
        self._start()

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no copied threads or OpenMP state
        self._conn, child_end = ctx.Pipe()
        args = (child_end, self.opts, self.threads, self.quiet)
        self.process = ctx.Process(target=_child_main, args=args, daemon=True)
        self.process.start()
        child_end.close()  # the child's end lives on in the child only: its exit is our EOF
        self._ready = False

    def facts(self) -> ModelFacts:
        if not self._ready:
            kind, payload = self._receive()
            if kind != "ready":
                self.close()
                raise payload
            self._facts, self._ready = payload, True
        assert self._facts is not None
        return self._facts

    def decode(self, lines: list[str], settings: Decoding, on_line: LineDone | None = None) -> list[Hypotheses]:
        return self._call("decode", (lines, settings), on_line)

    def attention(self, text: str, target: str, layer: int | None) -> dict[str, Any]:
        return self._call("attention", (text, target, layer))

    def _call(self, method: str, args: tuple, on_line: LineDone | None = None) -> Any:
        """Send the call and wait for its answer. A child that dies meanwhile (killed, out of memory)
        is replaced and asked once more; `on_line` may then hear a line twice."""
        try:
            return self._ask(method, args, on_line)
        except WorkerDied:
            return self._ask(method, args, on_line)  # a second death is the caller's error

    def _ask(self, method: str, args: tuple, on_line: LineDone | None) -> Any:
        if not self.process.is_alive():  # it died during an earlier call: a new one takes its place
            self._conn.close()
            self._start()
        self.facts()
        try:
            self._conn.send((method, args, on_line is not None))
        except OSError:  # the child is gone: its end of the pipe is closed
            raise self._died() from None
        while True:
            kind, payload = self._receive()
            if kind == "line":
                on_line(*payload)  # type: ignore[misc]
            elif kind == "done":
                return payload
            else:
                raise payload

    def _receive(self) -> tuple[str, Any]:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise self._died() from None

    def _died(self) -> WorkerDied:
        self.process.join(timeout=5)
        return WorkerDied(f"the model process {self.process.pid} exited (code {self.process.exitcode})")

    def close(self) -> None:
        """Close the pipe (the child then exits) and wait for the child."""
        self._conn.close()
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _child_main(conn: Connection, opts: InferenceOptions, threads: int, quiet: bool) -> None:
    """The child's life: load, report the facts (or the loading error), then answer calls until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and SIGTERM reach the whole process group:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the server decides when its children stop
    try:
        with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
            worker = InProcessWorker.load(opts, threads)
        conn.send(("ready", worker.facts()))
    except BaseException as e:
        conn.send(("error", _portable(e)))
        return
    while True:
        try:
            method, args, streaming = conn.recv()
        except (EOFError, OSError):
            return
        try:
            early = {"on_line": lambda i, hyps: conn.send(("line", (i, hyps)))} if streaming else {}
            conn.send(("done", getattr(worker, method)(*args, **early)))
        except Exception as e:
            conn.send(("error", _portable(e)))


def _portable(e: BaseException) -> BaseException:
    """`e` if it survives pickling (NmtError does), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


# --------------------------------------------------------------------------- the workers


class ModelWorkers:
    """`count` workers, each driven by its own thread; `await call(method, ...)` runs on an idle one."""

    def __init__(self, members: list[Worker], pools: list[concurrent.futures.ThreadPoolExecutor] | None = None) -> None:
        self.members = members
        self.pools = pools or [_one_thread(i) for i in range(len(members))]
        self.count = len(members)
        self._idle: asyncio.Queue[int] | None = None

    @classmethod
    def in_process(cls, load: Callable[[], Worker]) -> ModelWorkers:
        """One worker, made by `load` on the thread that will make all its calls."""
        pool = _one_thread()
        try:
            worker = pool.submit(load).result()
        except BaseException:
            pool.shutdown()
            raise
        return cls([worker], [pool])

    @classmethod
    def in_children(cls, opts: InferenceOptions, count: int, threads: int) -> ModelWorkers:
        """`count` child processes loading `opts`, each decoding with `threads` intra-op threads.
        The first loads alone and resolves the precision; the others load its result at once."""
        first = ChildWorker(opts, threads)
        members = [first]
        try:
            resolved = replace(opts, precision=first.facts().precision)
            first.opts = resolved  # a restart loads what the others have, without resolving again
            members += [ChildWorker(resolved, threads, quiet=True) for _ in range(count - 1)]
            for worker in members:
                worker.facts()
        except BaseException:
            for worker in members:
                worker.close()
            raise
        return cls(members)

    @property
    def facts(self) -> ModelFacts:
        return self.members[0].facts()

    def start(self) -> None:
        """Ready for `call` on the running event loop (each event loop that serves calls starts it)."""
        self._idle = asyncio.Queue()
        for i in range(self.count):
            self._idle.put_nowait(i)

    async def call(self, method: str, *args: Any) -> Any:
        """`worker.<method>(*args)` on an idle worker's thread, waiting for one if all are busy."""
        if self._idle is None:
            raise RuntimeError("ModelWorkers.start() was not called")
        i = await self._idle.get()
        try:
            fn = getattr(self.members[i], method)
            return await asyncio.get_running_loop().run_in_executor(self.pools[i], fn, *args)
        finally:
            self._idle.put_nowait(i)

    def close(self) -> None:
        for worker, pool in zip(self.members, self.pools, strict=True):
            pool.shutdown(wait=True)
            worker.close()


def _one_thread(i: int = 0) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"nmt-model-{i}")
