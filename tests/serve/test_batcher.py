"""Dynamic batching: requests gathered into shared model calls, results routed back in order, errors isolated."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from nmt.serve.batcher import Batcher, BatchLimits, Decoding
from nmt.serve.workers import ModelWorkers


class FakeModel:
    """Upper-cases lines; records every call; fails on lines containing 'boom'. `gated`: every call
    waits at `gate` until the test sets it (it is running, and recorded in `calls`, meanwhile)."""

    def __init__(self, gated: bool = False) -> None:
        self.calls: list[tuple[list[str], Decoding]] = []
        self.threads: set[str] = set()
        self.running = self.most_at_once = 0
        self._lock = threading.Lock()
        self.gate = threading.Event()
        if not gated:
            self.gate.set()

    def __call__(self, lines: list[str], settings: Decoding, on_line=None) -> list[list[tuple[str, float | None]]]:
        with self._lock:
            self.calls.append((list(lines), settings))
            self.threads.add(threading.current_thread().name)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        assert self.gate.wait(5), "the test never opened the gate"
        with self._lock:
            self.running -= 1
        if any("boom" in line for line in lines):
            raise ValueError("boom")
        return [[(line.upper() + "!" * settings.beam, -1.0)] for line in lines]


class Host:
    """A model host (nmt.serve.workers) whose `decode` is a plain function."""

    def __init__(self, decode) -> None:
        self.decode = decode

    def close(self) -> None:
        pass


def batcher_for(decode, limits: BatchLimits) -> Batcher:
    """A batcher over `limits.workers` worker threads, all decoding with `decode`."""
    return Batcher(ModelWorkers([Host(decode) for _ in range(max(1, limits.workers))]), limits)


def run(coro):
    return asyncio.run(coro)


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the event loop run until `condition()` holds; fail if it does not within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the awaited state never came"
        await asyncio.sleep(0.001)


async def _with_batcher(model, limits, body):
    batcher = batcher_for(model, limits)
    batcher.start()
    try:
        return await body(batcher)
    finally:
        await batcher.close()


def test_concurrent_requests_share_one_call_and_get_their_own_results_in_order():
    model = FakeModel()
    greedy = Decoding(beam=1)

    async def body(b):
        requests = [[f"r{i}a", f"r{i}b"] for i in range(10)]
        return requests, await asyncio.gather(*(b.translate(r, greedy) for r in requests))

    requests, results = run(_with_batcher(model, BatchLimits(max_wait_ms=50, max_batch=100), body))
    for lines, result in zip(requests, results, strict=True):
        assert [h[0][0] for h in result] == [line.upper() + "!" for line in lines]
    assert len(model.calls) == 1 and len(model.calls[0][0]) == 20
    assert model.threads == {next(iter(model.threads))} and "nmt-model" in next(iter(model.threads))


def test_two_workers_split_the_waiting_requests_and_decode_them_at_once():
    model = FakeModel(gated=True)

    async def body(b):
        jobs = asyncio.gather(*(b.translate([f"w{i}"], Decoding(beam=1)) for i in range(8)))
        await until(lambda: model.running == 2)  # both workers are inside a call at once
        model.gate.set()
        return await jobs

    results = run(_with_batcher(model, BatchLimits(max_wait_ms=50, max_batch=64, workers=2), body))
    assert [r[0][0][0] for r in results] == [f"W{i}!" for i in range(8)]
    assert sorted(len(lines) for lines, _ in model.calls) == [4, 4]  # an even share each, not 8 and 0
    assert model.most_at_once == 2 and len(model.threads) == 2


def test_a_lone_request_does_not_wait_for_company(monkeypatch):
    """The mechanism, not a stopwatch: with nobody else outstanding the batcher never waits."""
    model, waits = FakeModel(), []
    real_wait_for = asyncio.wait_for

    def spy(awaitable, timeout):
        waits.append(timeout)
        return real_wait_for(awaitable, timeout)

    monkeypatch.setattr(asyncio, "wait_for", spy)

    async def body(b):
        return await b.translate(["alone"], Decoding(beam=1))

    assert run(_with_batcher(model, BatchLimits(max_wait_ms=2000), body))[0][0][0] == "ALONE!"
    assert waits == []  # no wait for company was taken (the 2 s would have been one)


def test_a_request_is_answered_when_its_lines_are_done_not_when_its_batch_is():
    release = threading.Event()

    def streaming(lines, settings, on_line):
        on_line(0, [("early", None)])  # line 0 is done; the call goes on
        release.wait(5)
        return [[(f"late {line}", None)] for line in lines]

    async def body(b):
        short = asyncio.ensure_future(b.translate(["a"], Decoding(beam=1)))
        long = asyncio.ensure_future(b.translate(["b", "c"], Decoding(beam=1)))
        first = await asyncio.wait_for(asyncio.shield(short), 2)  # while the call still runs
        release.set()
        return first, await long

    first, rest = run(_with_batcher(streaming, BatchLimits(max_wait_ms=50), body))
    assert first == [[("early", None)]] and rest == [[("late b", None)], [("late c", None)]]


def test_max_batch_bounds_a_call_and_settings_are_never_mixed():
    model = FakeModel()

    async def body(b):
        jobs = [b.translate([f"s{i}"], Decoding(beam=1 + i % 2)) for i in range(12)]
        return await asyncio.gather(*jobs)

    results = run(_with_batcher(model, BatchLimits(max_wait_ms=50, max_batch=4), body))
    assert [r[0][0][0] for r in results] == [f"S{i}" + "!" * (1 + i % 2) for i in range(12)]
    for lines, settings in model.calls:
        assert len(lines) <= 4
        assert all(int(line[1:]) % 2 == settings.beam - 1 for line in lines)  # one setting per call
    assert sum(len(lines) for lines, _ in model.calls) == 12


def test_a_failing_request_fails_alone():
    model = FakeModel()

    async def body(b):
        good = [b.translate([f"ok{i}"], Decoding(beam=1)) for i in range(3)]
        bad = b.translate(["x", "boom"], Decoding(beam=1))
        return await asyncio.gather(*good, bad, return_exceptions=True)

    *good, bad = run(_with_batcher(model, BatchLimits(max_wait_ms=50), body))
    assert [g[0][0][0] for g in good] == ["OK0!", "OK1!", "OK2!"]
    assert isinstance(bad, ValueError)


def test_requests_arriving_while_decoding_form_the_next_batch_without_waiting():
    model = FakeModel(gated=True)

    async def body(b):
        first = asyncio.ensure_future(b.translate(["a"], Decoding(beam=1)))
        await until(lambda: model.running == 1)  # the first call is now running
        rest = [asyncio.ensure_future(b.translate([f"b{i}"], Decoding(beam=1))) for i in range(5)]
        await until(lambda: b.outstanding == 6)  # all five queued behind it
        model.gate.set()
        return await asyncio.gather(first, *rest)

    results = run(_with_batcher(model, BatchLimits(max_wait_ms=1, max_batch=64), body))
    assert len(results) == 6
    assert [len(lines) for lines, _ in model.calls] == [1, 5]


def test_a_cancelled_request_is_skipped_and_the_others_answered():
    model = FakeModel(gated=True)

    async def body(b):
        first = asyncio.ensure_future(b.translate(["first"], Decoding(beam=1)))
        await until(lambda: model.running == 1)  # the first call is running
        gone = asyncio.ensure_future(b.translate(["gone"], Decoding(beam=1)))
        kept = asyncio.ensure_future(b.translate(["kept"], Decoding(beam=1)))
        await until(lambda: b.outstanding == 3)  # both queued behind it
        gone.cancel()
        model.gate.set()
        return await asyncio.gather(first, kept)

    first, kept = run(_with_batcher(model, BatchLimits(max_wait_ms=1), body))
    assert kept[0][0][0] == "KEPT!"
    assert all("gone" not in lines for lines, _ in model.calls)


def test_close_finishes_queued_requests():
    model = FakeModel(gated=True)

    async def body():
        b = batcher_for(model, BatchLimits(max_wait_ms=0, max_batch=1))
        b.start()
        jobs = [asyncio.ensure_future(b.translate([f"q{i}"], Decoding(beam=1))) for i in range(4)]
        await until(lambda: b.outstanding == 4 and model.running == 1)  # one decoding, three queued
        model.gate.set()
        await b.close()
        return [j.result() for j in jobs]

    results = run(body())
    assert [r[0][0][0] for r in results] == [f"Q{i}!" for i in range(4)]


def test_translate_before_start_is_an_error():
    with pytest.raises(RuntimeError, match="start"):
        run(batcher_for(FakeModel(), BatchLimits()).translate(["x"], Decoding(beam=1)))


def test_a_decode_that_returns_the_wrong_count_is_an_error_and_the_worker_lives_on():
    calls = []

    def short(lines, settings, on_line=None):
        calls.append(lines)
        return [[("x", None)]] * (len(lines) - 1 if lines[0] == "bad" else len(lines))

    async def body(b):
        bad = await asyncio.gather(b.translate(["bad", "y"], Decoding(beam=1)), return_exceptions=True)
        good = await b.translate(["fine"], Decoding(beam=1))
        return bad[0], good

    bad, good = run(_with_batcher(short, BatchLimits(max_wait_ms=1), body))
    assert isinstance(bad, RuntimeError) and "1 results for 2 lines" in str(bad)
    assert good == [[("x", None)]]
