"""nmt.data.pool: results in the order of the work, with one worker and with several."""

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
