"""Work spread over worker processes, results taken in the order of the work.

The preparation stages cut their input into units that do not depend on the number of workers
and write results in unit order, so that one worker and many give the same bytes; this is the
one pool they share.
"""

from __future__ import annotations

import collections
import gc
import multiprocessing
import signal
from collections.abc import Callable, Iterable, Iterator


def map_ordered(
    fn: Callable, items: Iterable, workers: int, initializer: Callable, initargs: tuple
) -> Iterator[tuple[object, object]]:
    """(item, fn(item)) in the order of `items`: in this process for one worker, else in a pool
    (the platform's default start method) holding at most 2 × workers items."""
    if workers <= 1:
        initializer(*initargs)
        yield from ((item, fn(item)) for item in items)
        return
    # The parent's objects are frozen out of the garbage collector while the workers live: a
    # collection in a forked worker would otherwise visit every object it inherited, and so copy
    # each page of the parent's heap. (Another pool's objects, or ones frozen before, are thawed too
    # at the end: only speed depends on it.)
    gc.freeze()
    try:
        with multiprocessing.get_context().Pool(workers, _pool_worker, (initializer, *initargs)) as pool:
            pending: collections.deque = collections.deque()
            for item in items:
                pending.append((item, pool.apply_async(fn, (item,))))
                if len(pending) >= 2 * workers:
                    item, result = pending.popleft()
                    yield item, result.get()
            while pending:
                item, result = pending.popleft()
                yield item, result.get()
    finally:
        gc.unfreeze()


def _pool_worker(initializer: Callable, *initargs: object) -> None:
    """A pool worker's start: Ctrl-C is the parent's to handle (it stops the pool), not a
    traceback from every worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    initializer(*initargs)
