"""The model workers of a server: its model hosts (nmt/hosts.py) and which of them takes a call.

`ModelWorkers` keeps `count` hosts: one `LocalHost` in this process (`in_process`), or several
`ChildHost`s (`in_children`), each decoding with cores // count intra-op threads, for the
reasons given in nmt/hosts.py. For each host it counts the lines given to it and not answered
yet, its *load*; a call goes to the host with the least load. A host decodes the calls it is
given together (`nmt.joint`), so the batcher (nmt/batcher.py) may hand a busy host more work
once its load has fallen low enough (`ready`): the sentences of a new batch then start at the
next decoding step instead of waiting for the slowest sentence of the running one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nmt.hosts import ChildHost, LocalHost, ModelFacts, ModelHost

__all__ = ["ChildHost", "LocalHost", "ModelFacts", "ModelHost", "ModelWorkers"]


class ModelWorkers:
    """`count` hosts (anything with `submit(method, args, on_line)` returning a concurrent future,
    `facts()` and `close()`); `await call(method, ...)` runs on the least loaded one."""

    def __init__(self, hosts: list[Any]) -> None:
        self.hosts = hosts
        self.count = len(hosts)
        self.load = [0] * self.count  # per host: lines given and not answered (1 for a call of another kind)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._eased: asyncio.Event | None = None  # set when some load falls

    @classmethod
    def in_process(cls, load: Callable[[], ModelHost]) -> ModelWorkers:
        """One host, made by `load` on the thread that will make all its calls."""
        return cls([LocalHost(load)])

    @classmethod
    def in_children(cls, opts: Any, count: int, threads: int) -> ModelWorkers:
        """`count` child processes loading `opts`, each decoding with `threads` intra-op threads.
        The first loads alone and resolves `--precision auto`; the others load its result at once."""
        first = ChildHost(opts, threads)
        hosts = [first]
        try:
            resolved = replace(opts, precision=first.facts().precision)
            first.opts = resolved  # a restart loads what the others have, without resolving again
            hosts += [ChildHost(resolved, threads, quiet=True) for _ in range(count - 1)]
            for host in hosts:
                host.facts()
        except BaseException:
            for host in hosts:
                host.close()
            raise
        return cls(hosts)

    @property
    def facts(self) -> ModelFacts:
        return self.hosts[0].facts()

    def start(self) -> None:
        """Ready for `call` on the running event loop (each event loop that serves calls starts it)."""
        self._loop = asyncio.get_running_loop()
        self._eased = asyncio.Event()

    async def ready(self, at_most: int = 0) -> None:
        """Wait until some host's load is at most `at_most` lines (0: until one is idle)."""
        if self._eased is None:
            raise RuntimeError("ModelWorkers.start() was not called")
        while min(self.load) > at_most:
            self._eased.clear()
            await self._eased.wait()

    def submit(self, method: str, *args: Any) -> asyncio.Future:
        """Give `host.<method>(*args)` to the least loaded host now (on the event loop's thread);
        await the result. For "decode", args are (lines, settings[, on_line])."""
        if self._loop is None:
            raise RuntimeError("ModelWorkers.start() was not called")
        i = min(range(self.count), key=self.load.__getitem__)
        on_line = None
        if method == "decode":
            lines, settings, *rest = args
            args, left = (lines, settings), set(range(len(lines)))
            on_line = self._counting(i, left, rest[0] if rest else None)
        else:
            left = {0}
        self.load[i] += len(left)
        future = asyncio.wrap_future(self.hosts[i].submit(method, args, on_line), loop=self._loop)
        future.add_done_callback(lambda _: [self._answered(i, left, k) for k in list(left)])
        return future

    async def call(self, method: str, *args: Any) -> Any:
        return await self.submit(method, *args)

    def _counting(self, i: int, left: set[int], on_line: Any) -> Callable[[int, Any], None]:
        """An `on_line` for host i's call that takes each answered line off its load (on the
        event loop) and passes it on to `on_line` (on the host's thread)."""
        loop = self._loop
        assert loop is not None

        def line_done(k: int, hypotheses: Any) -> None:
            loop.call_soon_threadsafe(self._answered, i, left, k)
            if on_line is not None:
                on_line(k, hypotheses)

        return line_done

    def _answered(self, i: int, left: set[int], k: int) -> None:
        if k in left:  # a line is heard twice when a call was sent again to a new child
            left.discard(k)
            self.load[i] -= 1
            assert self._eased is not None
            self._eased.set()

    def close(self) -> None:
        for host in self.hosts:
            host.close()
