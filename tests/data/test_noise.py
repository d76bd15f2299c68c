"""nmt.data.noise: the tests for scraped-text noise, each on the texts it must catch and the
texts it must let through (names, numbers, mixed-script sentences)."""

from __future__ import annotations

import pytest

from nmt.data.noise import markup, near_hash, near_key, script_share


@pytest.mark.parametrize(
    ("text", "han", "share"),
    [
        ("我爱北京。", True, 1.0),
        ("我爱 AI", True, 2 / (2 + 2 / 3)),  # two Latin letters weigh 2/3 of a Han character
        ("I love you.", True, 0.0),  # an untranslated English line on the Chinese side
        ("I love you.", False, 1.0),
        ("我爱你。", False, 0.0),  # Chinese on the English side
        ("Café au lait", False, 1.0),  # accented letters are Latin
        ("これは日本語です", True, 3 / 8),  # kana count as other letters: 3 Han of 8 letters
    ],
)
def test_script_share_weighs_latin_letters_as_a_third_of_a_han_character(text, han, share):
    assert script_share(text, han) == pytest.approx(share)


def test_a_side_without_letters_has_no_share_to_judge():
    assert script_share("2024 / 3.5%", True) is None and script_share("!!!", False) is None


@pytest.mark.parametrize(
    "text",
    [
        "http://example.org/a?b=1",
        "www.youdao.com",
        "<br/>",
        "<p></p>",
        "&nbsp;",
        "mail@example.org。",
        "(https://x.cn)",
    ],
)
def test_markup_lines_are_caught(text):
    assert markup(text)


@pytest.mark.parametrize(
    "text",
    ["详情请见https://example.org，谢谢。", "the <xs:sequence> element", "3.5%", "Hello.", "AT&T", "[1] a", "{x}", ""],
)
def test_text_around_markup_or_no_markup_at_all_is_kept(text):
    assert not markup(text)


def test_the_near_key_drops_case_spaces_and_punctuation_only():
    assert near_key("He left!") == near_key("he  left.") == "heleft"
    assert near_key("他走了。") == near_key("他走了！") == "他走了"
    assert near_key("He left 2 days ago") != near_key("He left 3 days ago")
    assert near_hash("他走了。", "He left.") == near_hash("他走了！", "he left!")
    assert near_hash("他走了。", "He left.") != near_hash("他来了。", "He left.")
