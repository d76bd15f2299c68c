"""Dynamic batching for the server: concurrent requests are decoded together.

Each request (one or more sentences and its decoding settings) is queued with a future. One
asyncio task takes the first waiting request, then gathers more for at most `max_wait_ms`
(or until `max_batch` sentences are waiting), groups them by decoding settings, and hands
each group's sentences to `decode` in one call on a single worker thread (the model is used
by one thread at a time; `Translator` then sorts them by length into its own batches). While
a group decodes, new requests queue up and form the next batch, so under load batches fill
without any waiting. Results go back to each request in its input order.

A group that raises is decoded again one request at a time, so a request that makes the
model fail fails alone. Requests whose caller has gone (cancelled future) are skipped.

All model work of a server (loading, decoding, attention maps) runs on one `ModelThread`.
PyTorch's CPU ops run on an OpenMP team that belongs to the thread calling them; once a second
thread has called them too, the teams together outnumber the cores, and libgomp then spins only
briefly before putting a worker to sleep ("if there are more OpenMP threads than available
CPUs, 1000 and 100 spins are used", GCC's libgomp manual, GOMP_SPINCOUNT), so every small op of
a decoding step (layer norm, bmm, softmax over a few beams) pays a wake-up. Measured on a
2-core AMD EPYC: beam search in groups of 19 sentences at 65-76 sentences/s when the model was
loaded on the main thread and decoded on another, 107-127 with everything on one thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

Hypotheses = list[tuple[str, float | None]]  # (text, score) best first; score None for greedy


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


class ModelThread:
    """The one thread on which a server runs its model (see the module docstring for why)."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmt-model")

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the model thread and wait for it (before the event loop runs)."""
        return self._pool.submit(fn, *args).result()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the model thread without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class Batcher:
    """`await batcher.translate(lines, settings)` → one `Hypotheses` per line, in order.

    `decode(lines, settings)` must return one `Hypotheses` per line; it runs on `thread` (the
    one the model was loaded on; default: a new one), which the batcher owns from then on and
    shuts down in `close()`. `start()` and `close()` run on the event loop that serves the requests.
    """

    def __init__(
        self,
        decode: Callable[[list[str], Decoding], list[Hypotheses]],
        limits: BatchLimits,
        thread: ModelThread | None = None,
    ) -> None:
        self.decode, self.limits = decode, limits
        self.thread = thread or ModelThread()
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Job | None] | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        """Finish the queued requests, then stop the worker."""
        if self._queue is not None and self._task is not None:
            await self._queue.put(None)
            await self._task
        self.thread.shutdown()

    async def translate(self, lines: list[str], settings: Decoding) -> list[Hypotheses]:
        if self._queue is None:
            raise RuntimeError("Batcher.start() was not called")
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Job(list(lines), settings, future))
        return await future

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run other model work (e.g. an attention map) on the model thread, between batches."""
        return await self.thread.run(fn, *args)

    # ----------------------------------------------------------------------- the worker

    async def _loop(self) -> None:
        assert self._queue is not None
        stopping = False
        while not stopping:
            first = await self._queue.get()
            if first is None:
                break
            jobs, stopping = await self._gather(first)
            jobs = [j for j in jobs if not j.future.done()]  # callers that gave up
            jobs.sort(key=lambda j: repr(j.settings))
            for _, group in itertools.groupby(jobs, key=lambda j: j.settings):
                members = list(group)
                try:
                    await self._decode_group(members)
                except Exception as e:  # never let the worker die: every waiting request must get an answer
                    for job in members:
                        _settle(job.future, error=e)

    async def _gather(self, first: _Job) -> tuple[list[_Job], bool]:
        """`first` plus what arrives within max_wait_ms, up to max_batch sentences; True if asked to stop."""
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        jobs, count = [first], len(first.lines)
        deadline = loop.time() + self.limits.max_wait_ms / 1000
        while count < self.limits.max_batch:
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
        try:
            results = await self.run(self._decode_counted, lines, jobs[0].settings)
        except Exception as e:
            if len(jobs) == 1:
                _settle(jobs[0].future, error=e)
                return
            for job in jobs:  # find the culprit: everyone else still gets an answer
                await self._decode_group([job])
            return
        start = 0
        for job in jobs:
            _settle(job.future, results[start : start + len(job.lines)])
            start += len(job.lines)

    def _decode_counted(self, lines: list[str], settings: Decoding) -> list[Hypotheses]:
        results = self.decode(lines, settings)
        if len(results) != len(lines):
            raise RuntimeError(f"decode returned {len(results)} results for {len(lines)} lines")
        self.stats.add(len(lines))
        return results


def _settle(future: asyncio.Future, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():  # the caller was cancelled (client disconnected)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
