"""The rules for back-translated pairs only and the real:synthetic cap (nmt/data/synthetic_filter.py)."""

from __future__ import annotations

import numpy as np
import pytest

from nmt.config import config_from_dict
from nmt.data.synthetic_filter import cap_synthetic, longest_run, synthetic_reason, top_token_share
from nmt.errors import ConfigError


def data(direction: str = "zh-en", **bt):
    raw = {"data": {"direction": direction, "backtranslation": {"corpus": "bt", **bt}}}
    return config_from_dict(raw).data


def test_defaults_keep_real_at_least_as_large_and_filter_tighter_than_real_pairs():
    d = data()
    assert d.backtranslation.ratio == 1.0 and d.backtranslation.max_ratio < d.max_ratio
    assert d.backtranslation.max_char_run > 0 and d.backtranslation.max_token_share < 1


@pytest.mark.parametrize(
    ("src", "tgt", "reason"),
    [
        ("他走了。", "He left.", None),
        ("好。", "This is good, really very good.", "bt_ratio"),  # 2 characters against 31 / 3
        ("我把把把把你。", "I hold you close.", "char_run"),
        ("我的的我的的我的的。", "Mine of mine of mine.", "token_share"),
        ("他有10000元。", "He has 10000 yuan.", None),  # digits are exempt from char_run
        ("谢谢你谢谢你。", "Thank you, thank you.", None),  # a short side is not judged by token share
    ],
)
def test_each_rule_on_a_zh_synthetic_side(src, tgt, reason):
    assert synthetic_reason(src, tgt, data()) == reason


def test_the_synthetic_side_is_the_source_whatever_the_direction():
    """en-zh: the reverse model wrote English; a looping English side is dropped, a Chinese one is real text."""
    en_zh = data("en-zh")
    assert synthetic_reason("the the the the the cat sat on the mat", "猫坐在垫子上。", en_zh) == "token_share"
    assert synthetic_reason("Sooooo good.", "太好了。", en_zh) == "char_run"
    assert synthetic_reason("The cat sat on the mat.", "猫坐在垫子上的的的的。", en_zh) is None


def test_each_rule_can_be_turned_off():
    off = data(max_ratio=9.0, max_char_run=0, max_token_share=1.0)
    for src, tgt in [("好。", "This is good, really very good."), ("我把把把把你。", "I hold you close."),
                     ("我的的我的的我的的。", "Mine of mine of mine.")]:  # fmt: skip
        assert synthetic_reason(src, tgt, off) is None


def test_runs_and_shares():
    assert longest_run("aabbbc") == 3 and longest_run("1000000") == 0 and longest_run("") == 0
    assert top_token_share("我的的", chinese=True) == (2 / 3, 3)
    assert top_token_share("Go, go, GO!", chinese=False) == (1.0, 3)
    assert top_token_share("……", chinese=True) == (0.0, 0)


def test_the_cap_draws_ratio_times_real_seeded():
    masks = [np.ones(40, dtype=bool), np.array([True, False] * 30)]  # 70 candidates
    d = data(ratio=0.5)
    capped, dropped = cap_synthetic(masks, real_lines=100, data=d)
    assert sum(int(m.sum()) for m in capped) == 50 and dropped == 20
    assert all(not (c & ~m).any() for c, m in zip(capped, masks, strict=True))  # only candidates
    again, _ = cap_synthetic(masks, real_lines=100, data=d)
    assert all((a == c).all() for a, c in zip(again, capped, strict=True))  # seeded
    assert cap_synthetic(masks, real_lines=10**6, data=d)[1] == 0  # fewer candidates than the cap
    assert cap_synthetic(masks, real_lines=1, data=data(ratio=None))[1] == 0  # null: all


@pytest.mark.parametrize(
    ("key", "value"), [("ratio", 0), ("max_ratio", 0.5), ("max_char_run", -1), ("max_token_share", 0)]
)
def test_impossible_values_are_config_errors(key, value):
    with pytest.raises(ConfigError, match=rf"data\.backtranslation\.{key}"):
        data(**{key: value})
