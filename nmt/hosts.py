"""Where a server's model lives, and how calls reach it: on a thread of this process or in a child.

A `ModelHost` holds one loaded `Translator` and does what the server asks of the model: decode
a group of lines (`decode_steps`), draw a cross-attention map (`attention`), describe the model
(`facts`). A `HostLoop` runs the calls sent to one host on the thread where the model lives: a
decode call becomes a search coroutine in a `nmt.joint.JointSteps`, so calls that arrive while
others are decoding join their steps at once (one model call per step for all of them), and
other calls run between two steps. Two ways to reach a loop, with the same methods (`submit`
returns a future; `decode` and `attention` wait for it):

- `LocalHost`: the loop on a thread of this process, which also loads the model. PyTorch's CPU
  ops run on an OpenMP team that belongs to the calling thread: a model loaded on one thread and
  used on another brought a second team onto the cores, and each small op of a decoding step
  then paid a wake-up (beam search in groups of 19: 65-76 sentences/s against 107-127 on the
  loading thread, 2-core AMD EPYC, docs/BENCHMARKS.md "Serving under load").
- `ChildHost`: the loop in a spawned child process, over a pipe; a thread here reads its answers.
  Processes rather than threads because PyTorch holds Python's GIL between its ops, so model
  threads in one process wait for each other and for the HTTP event loop (two 1-thread workers
  decoding random groups of 16: 160 sentences/s as threads of one process, 175 as processes).

A child ignores SIGINT and SIGTERM (the server stops it once the requests in flight are
answered) and exits when its pipe closes, so it never outlives the server. A child that dies
is replaced by a new one, which is sent the calls it had not answered (once: a call that kills
two children fails). Children are spawned (a fresh interpreter, not a fork of a process with
threads), so a script of one's own that starts them needs Python's `if __name__ == "__main__":`
guard.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import multiprocessing
import pickle
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from nmt.batcher import Decoding, Hypotheses, LineDone
from nmt.search import Steps, run_steps

Call = tuple[int, str, tuple, bool]  # (call id, method, arguments, stream early lines)
Reply = Callable[[int, str, Any], None]  # (call id, "line" | "done" | "error", payload)


@dataclass(frozen=True)
class ModelFacts:
    """What the server says about its model (the host's translator, in plain values)."""

    config: Any  # nmt.config.Config
    checkpoint: str | None
    engine: str
    precision: str
    device: str
    src_vocab: int
    tgt_vocab: int
    attention_maps: bool  # the native engine: its attention weights can be read
    threads: int  # PyTorch intra-op threads the host decodes with


class ModelHost:
    """A loaded `Translator` (nmt.translate) and the model work of a server, run where it lives."""

    def __init__(self, translator: Any) -> None:
        import torch

        self.translator = translator
        self.threads = getattr(translator.engine, "threads", 0) or torch.get_num_threads()  # CTranslate2 keeps its own

    @classmethod
    def load(cls, opts: Any, threads: int = 0) -> ModelHost:
        """Load `opts` (`InferenceOptions`); then `threads` intra-op threads if > 0 (after loading, so
        that `--precision auto` resolves with the threads `nmt translate` has, and answers alike)."""
        import torch

        from nmt.translate import Translator

        if threads > 0 and opts.engine != "native":
            torch.set_num_threads(threads)  # CTranslate2 takes its thread count when it loads (and has no probe)
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
            attention_maps=t.model is not None,
            threads=self.threads,
        )

    def decode_steps(self, lines: list[str], s: Decoding, on_line: LineDone | None = None) -> Steps[list[Hypotheses]]:
        """Exactly `nmt translate`'s path, as a search coroutine: a beam of 1 without n-best runs
        greedy search (no score). `on_line(i, hypotheses)` hears of each line the beam search
        finishes before the group does."""
        greedy = s.beam == 1 and s.nbest == 1
        report = (lambda i, pairs: on_line(i, _scored(pairs))) if on_line is not None and not greedy else None
        found = yield from self.translator.steps(lines, 1, s.beam, s.nbest, s.len_penalty, not greedy, report)
        if greedy:
            return [[(pairs[0][0] if pairs else "", None)] for pairs in found]
        return [_scored(pairs) for pairs in found]

    def decode(self, lines: list[str], s: Decoding, on_line: LineDone | None = None) -> list[Hypotheses]:
        """`decode_steps` run alone."""
        return run_steps(self.translator.model, self.decode_steps(lines, s, on_line))

    def attention(self, text: str, target: str, layer: int | None) -> dict[str, Any]:
        """`nmt.attention_map.attention_map` as JSON-ready values."""
        from nmt.attention_map import attention_map

        return attention_map(self.translator, text, target, layer).to_dict()


def _scored(pairs: list[tuple[str, float]]) -> Hypotheses:
    return [(t, float(score)) for t, score in pairs] or [("", None)]


class HostLoop:
    """Runs the calls sent to `host`, on the thread where its model lives, until the sender closes.

    `receive(block)` returns the next `Call`, or None when none is waiting and `block` is False;
    it raises EOFError once the sender has closed (the searches under way are finished first).
    `reply(call id, kind, payload)` gets "line" (early lines), then "done" or "error"."""

    def __init__(self, host: ModelHost, reply: Reply) -> None:
        from nmt.joint import JointSteps

        self.host, self.reply = host, reply
        self.joint = JointSteps(host.translator.model)

    def run(self, receive: Callable[[bool], Call | None]) -> None:
        open_ = True
        while open_ or len(self.joint):
            if open_:
                open_ = self._take(receive)
            if len(self.joint):
                self.joint.step()

    def _take(self, receive: Callable[[bool], Call | None]) -> bool:
        """Start every waiting call (wait for one if nothing is decoding); False once closed."""
        block = not len(self.joint)
        while True:
            try:
                call = receive(block)
            except EOFError:
                return False
            if call is None:
                return True
            self._start(*call)
            block = False

    def _start(self, call_id: int, method: str, args: tuple, streaming: bool) -> None:
        if method != "decode":
            try:
                self.reply(call_id, "done", getattr(self.host, method)(*args))
            except Exception as e:
                self.reply(call_id, "error", e)
            return
        on_line = (lambda i, hyps: self.reply(call_id, "line", (i, hyps))) if streaming else None

        def finished(result: Any, error: BaseException | None) -> None:
            self.reply(call_id, *(("done", result) if error is None else ("error", error)))

        self.joint.add(self.host.decode_steps(*args, on_line=on_line), finished)


class _Calls:
    """The calls sent to one host and not answered yet (thread-safe): id → (future, on_line)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[concurrent.futures.Future, LineDone | None]] = {}
        self._next = 0

    def new(self, on_line: LineDone | None) -> tuple[int, concurrent.futures.Future]:
        with self.lock:
            self._next += 1
            future: concurrent.futures.Future = concurrent.futures.Future()
            self.pending[self._next] = (future, on_line)
            return self._next, future

    def deliver(self, call_id: int, kind: str, payload: Any) -> None:
        """Pass a reply on: an early line to the call's `on_line`, the end to its future."""
        with self.lock:
            entry = self.pending.get(call_id) if kind == "line" else self.pending.pop(call_id, None)
        if entry is None:
            return
        future, on_line = entry
        if kind == "line":
            if on_line is not None:
                on_line(*payload)
        elif kind == "done":
            future.set_result(payload)
        else:
            future.set_exception(payload)


class LocalHost:
    """A `HostLoop` on a thread of this process; `load()` makes the `ModelHost` on that thread."""

    def __init__(self, load: Callable[[], ModelHost]) -> None:
        self._inbox: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._calls = _Calls()
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._main, args=(load, ready), name="nmt-model", daemon=True)
        self._thread.start()
        self.host: ModelHost = ready.result()  # raises what loading raised

    def _main(self, load: Callable[[], ModelHost], ready: concurrent.futures.Future) -> None:
        try:
            host = load()
        except BaseException as e:
            ready.set_exception(e)
            return
        ready.set_result(host)
        HostLoop(host, self._calls.deliver).run(self._receive)

    def _receive(self, block: bool) -> Call | None:
        try:
            call = self._inbox.get(block)
        except queue.Empty:
            return None
        if call is None:
            raise EOFError
        return call

    def facts(self) -> ModelFacts:
        return self.host.facts()

    def submit(self, method: str, args: tuple, on_line: LineDone | None = None) -> concurrent.futures.Future:
        """Send `host.<method>(*args)` to the loop; the future holds its result."""
        call_id, future = self._calls.new(on_line)
        self._inbox.put((call_id, method, args, on_line is not None))
        return future

    def decode(self, lines: list[str], settings: Decoding, on_line: LineDone | None = None) -> list[Hypotheses]:
        return self.submit("decode", (lines, settings), on_line).result()

    def attention(self, text: str, target: str, layer: int | None) -> dict[str, Any]:
        return self.submit("attention", (text, target, layer)).result()

    def close(self) -> None:
        """Finish the calls sent, then stop the thread."""
        self._inbox.put(None)
        self._thread.join()


# --------------------------------------------------------------------------- a host in a child process


class WorkerDied(RuntimeError):
    """The child process of a host ended while it was asked something."""


class ChildHost:
    """A `HostLoop` in a spawned child process; its replies are read by a thread of this process."""

    def __init__(self, opts: Any, threads: int, quiet: bool = False) -> None:
        """Starts the child; `facts()` waits until it has loaded (and raises what loading raised).
        `quiet`: the child's loading messages (stderr) are dropped (its siblings' say the same)."""
        self.opts, self.threads, self.quiet = opts, threads, quiet
        self._calls = _Calls()
        self._sent: dict[int, tuple[Call, bool]] = {}  # unanswered calls: (call, sent to a second child)
        self._closing = self._restarting = False
        self._broken: BaseException | None = None  # why no replacement could be started
        self._facts: ModelFacts | None = None
        self._reader: threading.Thread | None = None
        self._spawn()

    def _spawn(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no copied threads or OpenMP state
        self._conn, child_end = ctx.Pipe()
        args = (child_end, self.opts, self.threads, self.quiet)
        self.process = ctx.Process(target=_child_main, args=args, daemon=True)
        self.process.start()
        child_end.close()  # the child's end lives on in the child only: its exit is our EOF

    def facts(self) -> ModelFacts:
        """The model's facts, once the child has loaded (the first call waits for it)."""
        if self._facts is None:
            self._facts = self._ready()
            self._reader = threading.Thread(target=self._read, name=f"nmt-child-{self.process.pid}", daemon=True)
            self._reader.start()
        return self._facts

    def _ready(self) -> ModelFacts:
        """Wait for the child's first message: its facts, or the error that stopped its loading."""
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            kind, payload = "error", self._died()
        if kind != "ready":
            self._conn.close()
            self.process.join(timeout=30)
            raise payload
        return payload

    def submit(self, method: str, args: tuple, on_line: LineDone | None = None) -> concurrent.futures.Future:
        """Send `host.<method>(*args)` to the child; the future holds its result."""
        self.facts()
        call_id, future = self._calls.new(on_line)
        call = (call_id, method, args, on_line is not None)
        if self._broken is not None:
            self._calls.deliver(call_id, "error", self._broken)
            return future
        with self._calls.lock:
            self._sent[call_id] = (call, False)
            if not self._restarting:  # else the replacement is sent every call in `_sent`
                with contextlib.suppress(OSError):  # a dead child: the reader sends it to the next one
                    self._conn.send(call)
        return future

    def decode(self, lines: list[str], settings: Decoding, on_line: LineDone | None = None) -> list[Hypotheses]:
        return self.submit("decode", (lines, settings), on_line).result()

    def attention(self, text: str, target: str, layer: int | None) -> dict[str, Any]:
        return self.submit("attention", (text, target, layer)).result()

    def _read(self) -> None:
        """The reader thread: pass the child's replies on; replace the child when it dies."""
        while True:
            try:
                call_id, kind, payload = self._conn.recv()
            except (EOFError, OSError):
                if self._closing or not self._replace():
                    return
                continue
            if kind != "line":
                with self._calls.lock:
                    self._sent.pop(call_id, None)
            self._calls.deliver(call_id, kind, payload)

    def _replace(self) -> bool:
        """A new child for a dead one; the calls it left unanswered go to the new one, except those
        that were sent to a replacement already (they fail). False if no child could be started."""
        died = self._died()
        with self._calls.lock:
            self._restarting = True
            again = {i: (call, True) for i, (call, retried) in self._sent.items() if not retried}
            failed = [i for i in self._sent if i not in again]
            self._sent = again
        for call_id in failed:
            self._calls.deliver(call_id, "error", died)
        self._conn.close()
        self._spawn()
        try:
            self._ready()
        except BaseException as e:
            with self._calls.lock:  # `_restarting` stays: nothing is sent to a child that cannot load
                lost, self._sent, self._broken = list(self._sent), {}, e
            for call_id in lost:
                self._calls.deliver(call_id, "error", e)
            return False
        with self._calls.lock:
            for call, _ in self._sent.values():
                self._conn.send(call)
            self._restarting = False
        return True

    def _died(self) -> WorkerDied:
        self.process.join(timeout=5)
        return WorkerDied(f"the model process {self.process.pid} exited (code {self.process.exitcode})")

    def close(self) -> None:
        """Ask the child to finish the calls sent and exit, then wait for it and the reader."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        if self._reader is not None:
            self._reader.join(timeout=5)
        self._conn.close()


def _child_main(conn: Connection, opts: Any, threads: int, quiet: bool) -> None:
    """The child's life: load, report the facts (or the loading error), then run its calls until
    the parent sends None or its pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and SIGTERM reach the whole process group:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the server decides when its children stop
    try:
        with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
            host = ModelHost.load(opts, threads)
        conn.send(("ready", host.facts()))
    except BaseException as e:
        conn.send(("error", _portable(e)))
        return

    def receive(block: bool) -> Call | None:
        try:
            if not block and not conn.poll():
                return None
            call = conn.recv()
        except OSError:
            raise EOFError from None
        if call is None:
            raise EOFError
        return call

    def reply(call_id: int, kind: str, payload: Any) -> None:
        with contextlib.suppress(OSError):  # the parent is gone: the loop ends at its next receive
            conn.send((call_id, kind, _portable(payload) if kind == "error" else payload))

    HostLoop(host, reply).run(receive)


def _portable(e: BaseException) -> BaseException:
    """`e` if it survives pickling (NmtError does), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")
