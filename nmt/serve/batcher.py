"""Dynamic batching for the server: concurrent requests are decoded together, on several workers.

Each request (one or more sentences and its decoding settings) is queued with a future. One
asyncio task waits until one of the model `workers` is free, takes the first waiting
request, gathers more for at most `max_wait_ms` (or until `max_batch` sentences are waiting),
groups them by decoding settings and hands each group's sentences to `decode` in one call on
that worker (`Translator` then sorts them by length into its own batches). While the workers
are busy, new requests queue up and form the next batch, so under load batches fill without
any waiting. Results go back to each request in its input order. A group that raises is
decoded again one request at a time, so a request that makes the model fail fails alone.
Requests whose caller has gone (cancelled future) are skipped.

The model work runs on `nmt.serve.workers.ModelWorkers` (threads driving the model, in this process
or in child processes; see there); the batcher decides what each of them decodes, when.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PEAK_WINDOW_S = 1.0  # how far back `Batcher._share` looks for the load
Hypotheses = list[tuple[str, float | None]]  # (text, score) best first; score None for greedy
LineDone = Callable[[int, Hypotheses], None]  # (line index in a model call, its hypotheses)


@dataclass(frozen=True)
class Decoding:
    """Settings that must be equal for requests to share a model call."""

    beam: int
    nbest: int = 1
    len_penalty: float = 1.0


@dataclass
class BatchLimits:
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for company
    max_batch: int = 64  # sentences gathered into one model call (a larger request is decoded whole)
    workers: int = 1  # model workers decoding batches at once (0 = `nmt.serve.app.auto_workers`)


@dataclass
class BatchStats:
    batches: int = 0  # model calls
    sentences: int = 0
    largest: int = 0  # sentences in the largest call
    sizes: list[int] = field(default_factory=list)  # sentences per call, the last 1000

    def add(self, n: int) -> None:
        self.batches += 1
        self.sentences += n
        self.largest = max(self.largest, n)
        self.sizes = [*self.sizes[-999:], n]


@dataclass
class _Job:
    lines: list[str]
    settings: Decoding
    future: asyncio.Future


class Batcher:
    """`await batcher.translate(lines, settings)` → one `Hypotheses` per line, in order.

    `workers` (`nmt.serve.workers.ModelWorkers`, or anything with its `count`, `start`, `call` and
    `close`) decode: `await workers.call("decode", lines, settings, on_line)` must return one
    `Hypotheses` per line, and may call `on_line(i, hypotheses)` as soon as line i is done (its
    request is then answered at once, if all its lines are). The batcher owns the workers and
    closes them in `close()`. `start()` and `close()` run on the event loop that serves the
    requests.
    """

    def __init__(self, workers: Any, limits: BatchLimits) -> None:
        self.workers, self.limits = workers, limits
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Job | None] | None = None
        self._task: asyncio.Task | None = None
        self._outstanding = 0  # sentences accepted and not yet answered
        self._peaks: collections.deque[tuple[float, int]] = collections.deque()  # (time, outstanding) rises

    @property
    def outstanding(self) -> int:
        """Sentences accepted and not yet answered (in `/info`: what a client or test can wait on)."""
        return self._outstanding

    def start(self) -> None:
        self.workers.start()
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        """Finish the queued requests, then close the workers."""
        if self._queue is not None and self._task is not None:
            await self._queue.put(None)
            await self._task
        self.workers.close()

    async def translate(self, lines: list[str], settings: Decoding) -> list[Hypotheses]:
        if self._queue is None:
            raise RuntimeError("Batcher.start() was not called")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._outstanding += len(lines)
        self._peaks.append((loop.time(), self._outstanding))
        try:
            await self._queue.put(_Job(list(lines), settings, future))
            return await future
        finally:
            self._outstanding -= len(lines)

    async def run(self, method: str, *args: Any) -> Any:
        """Other model work (e.g. `"attention"`) on an idle worker, between batches."""
        return await self.workers.call(method, *args)

    # ----------------------------------------------------------------------- the worker

    async def _loop(self) -> None:
        assert self._queue is not None
        free = asyncio.Semaphore(self.workers.count)
        running: set[asyncio.Task] = set()
        stopping = False
        while not stopping:
            await free.acquire()  # a worker is free: what is waiting now forms its batch
            first = await self._queue.get()
            if first is None:
                break
            jobs, stopping = await self._gather(first)
            task = asyncio.create_task(self._decode_batch(jobs))
            running.add(task)
            task.add_done_callback(lambda t: (running.discard(t), free.release()))
        await asyncio.gather(*running)

    async def _decode_batch(self, jobs: list[_Job]) -> None:
        jobs = [j for j in jobs if not j.future.done()]  # callers that gave up
        jobs.sort(key=lambda j: repr(j.settings))
        for _, group in itertools.groupby(jobs, key=lambda j: j.settings):
            members = list(group)
            try:
                await self._decode_group(members)
            except Exception as e:  # never let the worker die: every waiting request must get an answer
                for job in members:
                    _settle(job.future, error=e)

    def _share(self) -> int:
        """Sentences a free worker gathers: an even share (over the workers) of the most sentences
        outstanding in the last PEAK_WINDOW_S, at most max_batch. Closed-loop clients (each waits
        for its answer) would otherwise all end up in one batch while the other workers idle."""
        assert self._queue is not None
        now = asyncio.get_running_loop().time()
        while self._peaks and self._peaks[0][0] < now - PEAK_WINDOW_S:
            self._peaks.popleft()
        peak = max((n for _, n in self._peaks), default=self._outstanding)
        return max(1, min(self.limits.max_batch, math.ceil(peak / self.workers.count)))

    async def _gather(self, first: _Job) -> tuple[list[_Job], bool]:
        """`first` plus what arrives within max_wait_ms, up to `_share()` sentences; True if asked to stop."""
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        jobs, count, share = [first], len(first.lines), self._share()
        deadline = loop.time() + self.limits.max_wait_ms / 1000
        while count < share:
            try:
                job = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), left)
                except asyncio.TimeoutError:
                    break
            if job is None:
                return jobs, True
            jobs.append(job)
            count += len(job.lines)
        return jobs, False

    async def _decode_group(self, jobs: list[_Job]) -> None:
        lines = [line for j in jobs for line in j.lines]
        early = _EarlyAnswers(jobs, asyncio.get_running_loop())
        try:
            results = await self.workers.call("decode", lines, jobs[0].settings, early.line_done)
            if len(results) != len(lines):
                raise RuntimeError(f"decode returned {len(results)} results for {len(lines)} lines")
        except Exception as e:
            if len(jobs) == 1:
                _settle(jobs[0].future, error=e)
                return
            for job in jobs:  # find the culprit: everyone else still gets an answer
                if not job.future.done():  # (not answered early)
                    await self._decode_group([job])
            return
        self.stats.add(len(lines))
        start = 0
        for job in jobs:
            _settle(job.future, results[start : start + len(job.lines)])
            start += len(job.lines)


class _EarlyAnswers:
    """Answers each request of a model call as soon as all its lines are decoded, from the model
    thread (`line_done`), instead of when the whole call ends: a short sentence does not wait for
    the longest one of its batch, and its client can send its next request meanwhile."""

    def __init__(self, jobs: list[_Job], loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.where = [(job, k) for job in jobs for k in range(len(job.lines))]  # call's line i → (job, index)
        self.found: dict[int, list[Hypotheses | None]] = {id(job): [None] * len(job.lines) for job in jobs}
        self.left = {id(job): len(job.lines) for job in jobs}

    def line_done(self, i: int, hypotheses: Hypotheses) -> None:
        job, k = self.where[i]
        found = self.found[id(job)]
        if found[k] is None:
            found[k] = hypotheses
            self.left[id(job)] -= 1
            if self.left[id(job)] == 0:
                self.loop.call_soon_threadsafe(_settle, job.future, list(found))


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # the caller was cancelled (client disconnected)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
