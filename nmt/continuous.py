"""Continuous batching for the server: requests join the running beam search at its next step.

`nmt.batcher.Batcher` hands each free worker a batch and waits for its slowest sentence; a
GPU decoding step costs about the same for 5 rows as for 300, so small batches in arrival
order leave most of it idle (32 clients on an H200: 22-36% of offline throughput,
docs/BENCHMARKS.md "GPU"). `ContinuousBatcher` keeps one `nmt.inflight.InflightBeam` per
set of decoding settings running on a thread of its own: a request's sentences are encoded
and join at the next step, and each request is answered as soon as its last sentence is done.
On a CPU, where a step's cost grows with its rows, this measured slower than batching
(docs/BENCHMARKS.md, "Serving under load", fifth session), so `nmt serve` uses it on CUDA.

Requests the in-flight search does not cover (greedy decoding: beam 1 without n-best;
`decode.no_repeat_ngram`) and other model work go to the `Batcher` it wraps. Results are
`Batcher.translate`'s: one `Hypotheses` per line, "" with score None for a blank line.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from nmt.batcher import Batcher, Decoding, Hypotheses, _settle
from nmt.engines import pad_sources
from nmt.inflight import BeamSettings, InflightBeam


@dataclass
class _Request:
    lines: list[str]
    settings: Decoding
    future: asyncio.Future
    found: list[Hypotheses | None] = field(default_factory=list)
    left: int = 0


class ContinuousBatcher:
    """`await translate(lines, settings)` like `Batcher`; beam search runs in flight on one thread.

    `translator` (`nmt.translate.Translator`, native engine) is the model the thread decodes
    with; `fallback` (a `Batcher` over the same model's workers) serves everything else. Model
    errors fail the requests whose sentences were in the failing step, and nothing else.
    """

    def __init__(self, translator: Any, fallback: Batcher) -> None:
        self.translator, self.fallback = translator, fallback
        self.workers = fallback.workers
        self.stats = fallback.stats  # joins count as model calls (updated on the event loop)
        self._inbox: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._searches: dict[Decoding, InflightBeam] = {}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def covers(self, s: Decoding) -> bool:
        return not (s.beam == 1 and s.nbest == 1) and self.translator.config.decode.no_repeat_ngram == 0

    def start(self) -> None:
        self.fallback.start()
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="nmt-inflight", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Finish the sentences under way, then stop the thread and the fallback."""
        if self._thread is not None:
            self._inbox.put(None)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        await self.fallback.close()

    async def translate(self, lines: list[str], settings: Decoding) -> list[Hypotheses]:
        if not self.covers(settings):
            return await self.fallback.translate(lines, settings)
        if self._loop is None:
            raise RuntimeError("ContinuousBatcher.start() was not called")
        future = self._loop.create_future()
        self._inbox.put(_Request(list(lines), settings, future))
        return await future

    async def run(self, method: str, *args: Any) -> Any:
        return await self.fallback.run(method, *args)

    # ----------------------------------------------------------------------- the decoding thread

    def _run(self) -> None:
        open_ = True
        while open_ or any(len(s) for s in self._searches.values()):
            if open_:
                open_ = self._take(block=not any(len(s) for s in self._searches.values()))
            for settings, search in list(self._searches.items()):
                if len(search):
                    self._step(settings, search)

    def _take(self, block: bool) -> bool:
        """Join every waiting request, those with the same settings in one call (wait for one when
        nothing is decoding); False once closed."""
        waiting: dict[Decoding, list[_Request]] = {}
        open_ = True
        while True:
            try:
                request = self._inbox.get(block=block and not waiting)
            except queue.Empty:
                break
            if request is None:
                open_ = False
                break
            waiting.setdefault(request.settings, []).append(request)
        for settings, requests in waiting.items():
            self._join(settings, requests)
        return open_

    def _join(self, settings: Decoding, requests: list[_Request]) -> None:
        """Encode the requests' lines and add them to the search for `settings` in one call (blank
        lines are answered at once; a request whose lines cannot be encoded fails alone)."""
        seqs: list[list[int]] = []
        done: list[_LineDone] = []
        for r in requests:
            try:
                ids, masks = self.translator.encode(r.lines)
            except Exception as e:
                self._answer(r, error=e)
                continue
            r.found = [None if seq else [("", None)] for seq in ids]
            rows = [i for i, seq in enumerate(ids) if seq]
            r.left = len(rows)
            seqs += [ids[i] for i in rows]
            done += [_LineDone(self, r, i, masks[i]) for i in rows]
            if not rows:
                self._answer(r)
        if not seqs:
            return
        try:
            self._search(settings).add(pad_sources(seqs).to(self.translator.device), done)
        except Exception as e:
            for r in {id(cb.request): cb.request for cb in done}.values():
                self._answer(r, error=e)
            return
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.stats.add, len(seqs))

    def _search(self, s: Decoding) -> InflightBeam:
        if s not in self._searches:
            d = self.translator.config.decode
            settings = BeamSettings(s.beam, s.nbest, s.len_penalty, d.max_len_a, d.max_len_b, d.min_len)
            self._searches[s] = InflightBeam(self.translator.model, settings, self.translator.device)
        return self._searches[s]

    def _step(self, settings: Decoding, search: InflightBeam) -> None:
        """One step; if the model raises, the requests with sentences in it fail and the search restarts."""
        try:
            search.step()
        except Exception as e:
            live = search.live.done if search.live is not None else []
            for request in {id(cb.request): cb.request for cb in live}.values():
                self._answer(request, error=e)
            del self._searches[settings]

    def _answer(self, r: _Request, error: BaseException | None = None) -> None:
        assert self._loop is not None
        if error is not None:
            self._loop.call_soon_threadsafe(_settle, r.future, None, error)
        else:
            self._loop.call_soon_threadsafe(_settle, r.future, list(r.found))


@dataclass
class _LineDone:
    """The callback of one sentence in flight: its text into the request, which is answered with its last."""

    batcher: ContinuousBatcher
    request: _Request
    line: int
    masked: Any  # nmt.passthrough.Masked | None

    def __call__(self, hyps: list) -> None:
        r, to_text = self.request, self.batcher.translator.to_text
        r.found[self.line] = [(to_text(h.tokens, self.masked), float(h.score)) for h in hyps] or [("", None)]
        r.left -= 1
        if r.left == 0:
            self.batcher._answer(r)
