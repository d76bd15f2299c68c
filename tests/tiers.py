"""The test tiers, marked where the tests live, and the guard that keeps training out of the fast tier.

A test that trains a model or starts processes (servers, torchrun, a browser, a killed training)
is `slow`: `pytestmark = pytest.mark.slow` in a module of such tests, `@pytest.mark.slow` on one
test. `make test-fast` runs `-m "not slow"`, `make test` everything.

A fixture that trains a model says so with `@trains` under its `@pytest.fixture`. A test that uses
one, directly or through other fixtures, trains too; if it is not marked slow, the fast tier would
train without anyone seeing why. `unmarked_users` names such tests, and tests/conftest.py fails the
collection on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import pytest

F = TypeVar("F", bound=Callable)
TRAINS = "nmt_trains_a_model"  # the attribute `trains` sets on a fixture's function


def trains(function: F) -> F:
    """Declare a fixture function as one that trains a model (decorate it before `@pytest.fixture`)."""
    setattr(function, TRAINS, True)
    return function


def training_fixtures(item: pytest.Item) -> list[str]:
    """The fixtures declared `@trains` among those `item` uses, directly or through others (sorted)."""
    info = getattr(item, "_fixtureinfo", None)  # None for items that are not test functions
    if info is None:
        return []
    # the last definition of a name is the one the test gets (a module's override of a conftest's)
    defs = info.name2fixturedefs
    return sorted(name for name, found in defs.items() if found and getattr(found[-1].func, TRAINS, False))


def unmarked_users(items: Iterable[pytest.Item]) -> list[str]:
    """One line per test that uses a training fixture without being marked slow: its id and the fixtures."""
    return [
        f"{item.nodeid} uses {', '.join(names)}"
        for item in items
        if item.get_closest_marker("slow") is None and (names := training_fixtures(item))
    ]


def check_tiers(items: Iterable[pytest.Item]) -> None:
    """Fail the collection (a usage error, one line per test) when a test that trains is not marked slow."""
    unmarked = unmarked_users(items)
    if unmarked:
        lines = "\n  ".join(unmarked)
        raise pytest.UsageError(
            f"{len(unmarked)} test(s) use a fixture that trains a model (@trains) but are not marked slow;"
            f" add @pytest.mark.slow (or pytestmark = pytest.mark.slow in the module):\n  {lines}"
        )
