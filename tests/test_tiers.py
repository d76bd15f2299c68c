"""The guard of the test tiers (tests/tiers.py): a test that uses a fixture declared `@trains`,
directly or through another fixture, fails the collection unless it is marked slow."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

CONFTEST = """
import pytest
from tiers import check_tiers, trains


@pytest.fixture(scope="session")
@trains
def trained():
    return "a model"


@pytest.fixture
def served(trained):
    return trained


def pytest_collection_modifyitems(items):
    check_tiers(items)
"""


def test_a_test_that_trains_unmarked_fails_the_collection_by_name(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_mixed="""
        import pytest

        def test_cheap():
            pass

        def test_direct(trained):
            pass

        @pytest.mark.parametrize("n", [1, 2])
        def test_through_a_fixture(served, n):
            pass

        @pytest.mark.slow
        def test_marked(trained):
            pass
        """
    )
    result = pytester.runpytest("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: 3 test(s) use a fixture that trains a model (@trains) but are not marked slow;*",
            "  test_mixed.py::test_direct uses trained",
            "  test_mixed.py::test_through_a_fixture[[]1[]] uses trained",
            "  test_mixed.py::test_through_a_fixture[[]2[]] uses trained",
        ]
    )
    assert "test_cheap" not in result.stderr.str() and "test_marked" not in result.stderr.str()


def test_a_module_marked_slow_or_an_override_that_does_not_train_passes(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_slow="""
        import pytest

        pytestmark = pytest.mark.slow

        def test_direct(trained):
            pass

        def test_through_a_fixture(served):
            pass
        """,
        test_override="""
        import pytest

        @pytest.fixture
        def trained():
            return "a model built by hand"

        def test_cheap_model(served):
            pass
        """,
    )
    result = pytester.runpytest("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["3 tests collected*"])
