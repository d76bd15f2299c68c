"""Raw config values made typed (`nmt.config_values`), on dataclasses of the tests' own: the
module is generic over the schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from nmt.config_values import build_section, parse_duration, suggest
from nmt.errors import ConfigError


@dataclass
class Inner:
    size: int = 1


@dataclass
class Section:
    rate: float = 0.5
    kind: Literal["a", "b"] = "a"
    kinds: list[str] = field(default_factory=list)
    pair: tuple[float, float] = (0.0, 1.0)
    inner: Inner | None = None


@pytest.mark.parametrize(
    ("text", "seconds"), [("", 0.0), ("20m", 1200.0), ("1h30m", 5400.0), ("90s", 90.0), ("45", 45.0)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_parse_duration_names_what_it_cannot_read():
    with pytest.raises(ValueError, match="20 minutes"):
        parse_duration("20 minutes")


def test_values_become_the_declared_types():
    raw = {"rate": 3, "kind": "b", "kinds": "x, y", "pair": [1, 2], "inner": {"size": 4}}
    got = build_section(Section, raw, "sec", "exp.yaml")
    assert got == Section(rate=3.0, kind="b", kinds=["x", "y"], pair=(1.0, 2.0), inner=Inner(size=4))
    assert isinstance(got.rate, float) and isinstance(got.pair, tuple)
    assert build_section(Section, {"rate": "5e-3"}, "sec", "exp.yaml").rate == pytest.approx(0.005)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"rte": 1.0}, "exp.yaml: unknown key sec.rte (did you mean 'rate'?)"),
        ({"kind": "c"}, "exp.yaml: sec.kind: 'c' is not one of a | b"),
        ({"rate": "fast"}, "exp.yaml: sec.rate: expected float, got 'fast'"),
        ({"pair": [1.0]}, "exp.yaml: sec.pair: expected"),
        ({"inner": {"sise": 2}}, "exp.yaml: unknown key sec.inner.sise (did you mean 'size'?)"),
        ({"inner": {"size": True}}, "exp.yaml: sec.inner.size: expected int, got True"),
    ],
)
def test_a_wrong_value_is_one_error_naming_the_key(raw, message):
    with pytest.raises(ConfigError) as e:
        build_section(Section, raw, "sec", "exp.yaml")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_suggest_only_close_names():
    assert suggest("d_modle", ["d_model", "heads"]) == " (did you mean 'd_model'?)"
    assert suggest("zzz", ["d_model", "heads"]) == ""
