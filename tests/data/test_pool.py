"""nmt.data.pool: results in the order of the work, with one worker and with several."""

import gc
import multiprocessing

import pytest

from nmt.data.pool import map_ordered

_OFFSET = {"value": 0}


def _init(offset: int) -> None:
    _OFFSET["value"] = offset


def _work(n: int) -> int:
    return n * n + _OFFSET["value"]


@pytest.mark.parametrize("workers", [1, 2])
def test_results_come_in_the_order_of_the_items_with_the_initializer_applied(workers):
    items = list(range(40, 0, -1))  # uneven work, so a pool finishes out of order
    got = list(map_ordered(_work, iter(items), workers, _init, (7,)))
    assert got == [(n, n * n + 7) for n in items]


def _frozen(_: int) -> int:
    return gc.get_freeze_count()


@pytest.mark.skipif(
    multiprocessing.get_start_method() != "fork", reason="workers are forked only where fork is the default"
)
def test_forked_workers_leave_the_parents_objects_out_of_their_collections():
    """Frozen in the parent while the pool lives (a worker's collection would otherwise copy the
    parent's heap page by page), collected again once the work is done."""
    ballast = [[i] for i in range(10_000)]  # objects the parent holds
    got = [n for _, n in map_ordered(_frozen, iter(range(4)), 2, _init, (0,))]
    assert all(n >= len(ballast) for n in got)
    assert gc.get_freeze_count() == 0
