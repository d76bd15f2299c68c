"""Text normalisation follows the direction: T→S and NFKC on the Chinese side wherever it is."""

from __future__ import annotations

import pytest

from nmt.config import DataConfig
from nmt.data.normalize import normalize_source, normalize_target


def test_traditional_to_simplified_applies_to_the_chinese_side_of_either_direction():
    zh_en, en_zh = DataConfig(direction="zh-en"), DataConfig(direction="en-zh")
    assert normalize_source("這本書", zh_en) == "这本书" and normalize_target("這本書", en_zh) == "这本书"
    assert normalize_target("這本書", zh_en) == "這本書"  # the English side is never converted
    assert normalize_source("這本書", en_zh) == "這本書"
    assert normalize_target("ＡＩ  來了", en_zh) == "AI 来了"  # NFKC and whitespace too


def _generated_chinese(n: int, seed: int) -> list[str]:
    """Sentences stitched from OpenCC's own dictionary keys and values (phrases, changing and
    unchanged characters), common characters, separators and Latin text: every branch of the
    shortcut, and phrase keys next to characters that the character map would change."""
    import random

    from nmt.data.normalize import _opencc

    (group,) = _opencc()._dict_chain_data
    phrases, chars = sorted(group[0][2]), sorted(group[1][2])
    values = sorted({v.split(" ")[0] for _, _, d in group for v in d.values()})
    pieces = [
        phrases,
        chars,
        values,
        list("的一是了我不人在他有这个们中来上大为和国"),
        list("，。？！、 -.…「」"),
        ["AI", "Tom", "２０"],
    ]
    rng = random.Random(seed)
    return ["".join(rng.choice(rng.choice(pieces)) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def test_the_t2s_shortcut_equals_the_full_conversion_on_generated_text():
    from synthetic import pairs

    from nmt.data.normalize import _t2s, full_t2s, to_simplified

    shortcut = _t2s()
    assert shortcut.exact  # else every sentence goes to OpenCC and the shortcut is never exercised
    texts = _generated_chinese(3000, seed=1) + [zh for zh, _ in pairs(500, traditional=0.5)]
    converted = [(text, to_simplified(text), full_t2s(text)) for text in texts]
    assert [(t, fast) for t, fast, _ in converted] == [(t, full) for t, _, full in converted]
    changed = sum(fast != t for t, fast, _ in converted)
    kept = sum(shortcut.changing.isdisjoint(t) for t in texts)
    mapped = sum(not shortcut.changing.isdisjoint(t) and shortcut.phrase.search(t) is None for t in texts)
    assert changed > 500 and kept > 100 and mapped > 500  # all three paths taken


def test_the_nfkc_shortcut_equals_the_full_normalisation():
    import unicodedata

    data = DataConfig(t2s=False)
    texts = ["ＡＩ　ｆｕｌｌ", "e\u0301té", "Ω ℃ ﬁ ①", "plain ascii", "中文，標點。", "\u1100\u1161\u11a8"]
    for text in texts + _generated_chinese(500, seed=2):
        assert normalize_source(text, data) == " ".join(unicodedata.normalize("NFKC", text).split())


@pytest.mark.real_data
def test_the_t2s_shortcut_equals_the_full_conversion_on_the_real_corpora(shared_data):
    import json
    import unicodedata

    from nmt.data.normalize import full_t2s, to_simplified

    files = sorted(shared_data.glob("*-zh-en/*.jsonl"))
    assert files
    n = 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                zh = unicodedata.normalize("NFKC", json.loads(line)["translation"]["zh"])
                assert to_simplified(zh) == full_t2s(zh), f"{path}:{lineno}"
                n += 1
    assert n > 1000


def test_a_converter_of_another_shape_gets_every_sentence():
    from nmt.data.normalize import _T2S

    class Other:  # no dictionaries where the shortcut looks for them
        def convert(self, text: str) -> str:
            return text.replace("書", "书")

    shortcut = _T2S(Other())
    assert not shortcut.known and shortcut("這本書") == "這本书"
