"""Text normalisation follows the direction: T→S and NFKC on the Chinese side wherever it is."""

from __future__ import annotations

from nmt.config import DataConfig
from nmt.data.normalize import normalize_source, normalize_target


def test_traditional_to_simplified_applies_to_the_chinese_side_of_either_direction():
    zh_en, en_zh = DataConfig(direction="zh-en"), DataConfig(direction="en-zh")
    assert normalize_source("這本書", zh_en) == "这本书" and normalize_target("這本書", en_zh) == "这本书"
    assert normalize_target("這本書", zh_en) == "這本書"  # the English side is never converted
    assert normalize_source("這本書", en_zh) == "這本書"
    assert normalize_target("ＡＩ  來了", en_zh) == "AI 来了"  # NFKC and whitespace too
