"""A procedural zh→en corpus for the tests: deterministic, self-contained, and learnable.

Every test that needs parallel data builds it here instead of reading `../shared/data`, so a
fresh clone runs the whole suite. The task is a small, regular grammar that a one-layer model
learns in seconds (the tests assert that it does):

- counted things:  `他们买了七只红色的猫。` → `They bought seven red cats.`
- amounts:         `这本书二十五元。` → `This book costs 25 yuan.`  (Chinese numerals 1-99 → digits)
- dates:           `我的生日是三月十二日。` → `My birthday is on March 12.`
- clock times:     `我们九点见。` → `We meet at nine o'clock.`
- questions:       `你有几本书？` → `How many books do you have?`

With `spans > 0` a share of the pairs comes from a second grammar whose Chinese holds what
pass-through copies (nmt/data/passthrough.py): Latin names and Arabic numbers, the same text on
both sides.

- addresses:       `Anna住在305号。` → `Anna lives at number 305.`
- phone numbers:   `请打4821。` → `Please call 4821.`
- names:           `我叫Tom。` → `My name is Tom.`, `Emma和Max是朋友。` → `Emma and Max are friends.`
- money:           `Peter有974元。` → `Peter has 974 yuan.`
- rooms, buses:    `他的房间是2046号。` → `His room is number 2046.`, `我坐117路车。` → `I take bus 117.`
- counted things:  `Sophie买了十个苹果。` → `Sophie bought ten apples.`

Names and numbers come from two lists of 20 (`SPAN_NAMES`, `SPAN_NUMBERS`), which a tiny model
learns as pieces of both vocabularies in seconds. Each of the grammar's 11 slots (a place in one
sentence pattern) keeps a third of them out of training (`held_out`): `write_mirror` fills the
test split's slots with those only and the training and validation splits with the others, so a
test span is one the model has seen, but never in that place: it is kept by carrying it over from
the source, not by recalling a training sentence. (Names and numbers never seen at all would need
the model to copy letter by letter, which a tiny model does not learn in seconds.)

A fraction of the pairs is written in Traditional characters (`個`, `書`, `買`, `貓`, `鳥`, `點`
…); the test split labels each line `cmn_Hant` or `cmn_Hans` in `test.codes.txt`, like the real
Tatoeba mirror.

API:

    pairs(n, seed=0, traditional=0.2, spans=0.0, held_out_from=None) -> list[tuple[str, str]]
        n pairs with distinct English (so no Simplified/Traditional twins), the same for the
        same arguments. `spans`: the share of pairs drawn from the names-and-numbers grammar
        above; 0 (the default) gives exactly the pairs this function gave before that grammar.
        From index `held_out_from` on, span pairs fill their slots with held-out entries only.
    script_code(zh) -> str
        "cmn_Hant" if zh holds a Traditional-only character of this grammar, else "cmn_Hans".
    write_mirror(root, train=2000, valid=200, test=200, seed=0, subdir="tatoeba-zh-en", spans=0.0) -> Path
        Writes <root>/<subdir>/{train,validation,test}.jsonl in the Hugging Face translation
        schema ({"translation": {"zh": ..., "en": ...}}, one per line, UTF-8) and
        test.codes.txt; returns <root> (what `--mirror` / `NMT_MIRROR` takes). The three
        splits share no pair. `spans` is passed to `pairs`, with `held_out_from` the test split.
    vocab_pairs(n, seed=0) -> list[tuple[str, str]]
        n pairs with a large inventory: half `pairs`, half random common CJK characters
        (Zipf-like, about 1,500 distinct in 3,000 pairs) with pseudo-English of matching length.
        For vocabulary tests (character coverage, byte fallback, sizes); not learnable.
    write_mirror(..., rich=True) writes vocab_pairs instead of pairs (`spans` must then be 0).
    span_texts(zh, en) -> set[str]
        The names and numbers a pair of the span grammar holds on both sides (what a model must copy).
    held_out(item, slot) -> bool
        Whether entry `item` of SPAN_NAMES / SPAN_NUMBERS is kept out of `slot` in training.
    write_plain(folder, stem, rows) -> tuple[Path, Path]
        <folder>/<stem>.zh and <stem>.en, one sentence per line.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np

NUMBERS = ["一", "二", "三", "四", "五", "六", "七", "八", "九", "十"]
NUMBER_WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
SUBJECTS = [("我", "I"), ("你", "You"), ("他", "He"), ("她", "She"), ("我们", "We"), ("他们", "They")]
VERBS = [("有", "have", "has"), ("买了", "bought", "bought"), ("看见了", "saw", "saw"), ("喜欢", "like", "likes")]
THINGS = [("只", "猫", "cat"), ("条", "狗", "dog"), ("本", "书", "book"), ("个", "苹果", "apple"), ("只", "鸟", "bird")]
COLOURS = [("红色的", "red"), ("白色的", "white"), ("黑色的", "black"), ("大", "big"), ("小", "small"), ("", "")]
ITEMS = [("这本书", "This book"), ("这个苹果", "This apple"), ("那只猫", "That cat"), ("这张票", "This ticket")]
MONTHS = [
    *("January", "February", "March", "April", "May", "June"),
    *("July", "August", "September", "October", "November", "December"),
]
DAYS_PER_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
EVENTS = [("我的生日是", "My birthday is on"), ("会议在", "The meeting is on"), ("我们", "We leave on")]
EVENT_ENDS = ("。", "。", "出发。")

_TRADITIONAL = str.maketrans("个书买猫鸟点见们这张会议红头条", "個書買貓鳥點見們這張會議紅頭條")
_TRADITIONAL_ONLY = set("個書買貓鳥點見們這張會議紅頭條")


def chinese_number(n: int) -> str:
    """1..99 in Chinese numerals: 7 七, 10 十, 12 十二, 20 二十, 25 二十五."""
    tens, ones = divmod(n, 10)
    head = "" if tens == 0 else ("十" if tens == 1 else NUMBERS[tens - 1] + "十")
    return head + (NUMBERS[ones - 1] if ones else "")


def _counted(rng: random.Random) -> tuple[str, str]:
    (zs, es), (zv, ev1, ev3), (cl, zt, et) = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(THINGS)
    (zc, ec), k = rng.choice(COLOURS), rng.randrange(1, 11)
    verb = ev3 if es in ("He", "She") else ev1
    noun = et if k == 1 else et + "s"
    words = [es, verb, NUMBER_WORDS[k - 1]] + ([ec] if ec else []) + [noun]
    return f"{zs}{zv}{NUMBERS[k - 1]}{cl}{zc}{zt}。", " ".join(words) + "."


def _amount(rng: random.Random) -> tuple[str, str]:
    (zi, ei), n = rng.choice(ITEMS), rng.randrange(1, 100)
    return f"{zi}{chinese_number(n)}元。", f"{ei} costs {n} yuan."


def _date(rng: random.Random) -> tuple[str, str]:
    i, m = rng.randrange(len(EVENTS)), rng.randrange(12)
    d = rng.randrange(1, DAYS_PER_MONTH[m] + 1)
    (ze, ee), end = EVENTS[i], EVENT_ENDS[i]
    return f"{ze}{chinese_number(m + 1)}月{chinese_number(d)}日{end}", f"{ee} {MONTHS[m]} {d}."


def _clock(rng: random.Random) -> tuple[str, str]:
    (zs, es), h = rng.choice(SUBJECTS[4:] + SUBJECTS[:1]), rng.randrange(1, 13)
    return f"{zs}{chinese_number(h)}点见。", f"{es} meet at {NUMBER_WORDS[h - 1] if h <= 10 else h} o'clock."


def _question(rng: random.Random) -> tuple[str, str]:
    (zs, es), (cl, zt, et) = rng.choice(SUBJECTS), rng.choice(THINGS)
    pronoun = {"I": "I", "You": "you", "He": "he", "She": "she", "We": "we", "They": "they"}[es]
    does = "does" if es in ("He", "She") else "do"
    return f"{zs}有几{cl}{zt}？", f"How many {et}s {does} {pronoun} have?"


_KINDS = (_counted, _counted, _amount, _date, _clock, _question)

# --------------------------------------------------------------------------- names and numbers

SPAN_NAMES = (
    *("Anna", "Tom", "Maria", "Peter", "Lucas", "Emma", "Kevin", "Sophie", "David", "Laura"),
    *("Felix", "Nina", "Oscar", "Clara", "Hugo", "Julia", "Max", "Lena", "Paul", "Mia"),
)
SPAN_NUMBERS = (
    *("305", "4821", "117", "2046", "738", "9150", "562", "3379", "840", "6093"),
    *("291", "7415", "603", "1288", "974", "5530", "426", "8067", "159", "2712"),
)
_SPAN_TEXT = re.compile(r"[A-Za-z]+|[0-9]+")


def held_out(item: int, slot: int) -> bool:
    """Whether `SPAN_NAMES`/`SPAN_NUMBERS` entry `item` is kept out of `slot` (a place in one
    sentence pattern, 0-10) in training: a third of the entries per slot, a different third each."""
    return (item + slot) % 3 == 0


def _pick(rng: random.Random, items: tuple[str, ...], slot: int, test: bool, avoid: str = "") -> str:
    """An entry of `items` for `slot`: one held out of it where `test`, else one that is not."""
    return rng.choice([x for i, x in enumerate(items) if held_out(i, slot) == test and x != avoid])


def _address(rng: random.Random, test: bool) -> tuple[str, str]:
    name, number = _pick(rng, SPAN_NAMES, 0, test), _pick(rng, SPAN_NUMBERS, 1, test)
    return f"{name}住在{number}号。", f"{name} lives at number {number}."


def _phone(rng: random.Random, test: bool) -> tuple[str, str]:
    number = _pick(rng, SPAN_NUMBERS, 2, test)
    return f"请打{number}。", f"Please call {number}."


def _called(rng: random.Random, test: bool) -> tuple[str, str]:
    name = _pick(rng, SPAN_NAMES, 3, test)
    return f"我叫{name}。", f"My name is {name}."


def _friends(rng: random.Random, test: bool) -> tuple[str, str]:
    a = _pick(rng, SPAN_NAMES, 4, test)
    b = _pick(rng, SPAN_NAMES, 5, test, avoid=a)
    return f"{a}和{b}是朋友。", f"{a} and {b} are friends."


def _money(rng: random.Random, test: bool) -> tuple[str, str]:
    name, number = _pick(rng, SPAN_NAMES, 6, test), _pick(rng, SPAN_NUMBERS, 7, test)
    return f"{name}有{number}元。", f"{name} has {number} yuan."


OWNERS = [("我", "My"), ("你", "Your"), ("他", "His"), ("她", "Her"), ("我们", "Our"), ("他们", "Their")]


def _room(rng: random.Random, test: bool) -> tuple[str, str]:
    (zo, eo), number = rng.choice(OWNERS), _pick(rng, SPAN_NUMBERS, 9, test)
    return f"{zo}的房间是{number}号。", f"{eo} room is number {number}."


def _bus(rng: random.Random, test: bool) -> tuple[str, str]:
    (zs, es), number = rng.choice(SUBJECTS), _pick(rng, SPAN_NUMBERS, 10, test)
    return f"{zs}坐{number}路车。", f"{es} {'takes' if es in ('He', 'She') else 'take'} bus {number}."


def _named_counted(rng: random.Random, test: bool) -> tuple[str, str]:
    """`_counted` with a name as the subject (third person, no colour)."""
    name, (zv, _, ev3) = _pick(rng, SPAN_NAMES, 8, test), rng.choice(VERBS)
    (cl, zt, et), k = rng.choice(THINGS), rng.randrange(1, 11)
    noun = et if k == 1 else et + "s"
    return f"{name}{zv}{NUMBERS[k - 1]}{cl}{zt}。", f"{name} {ev3} {NUMBER_WORDS[k - 1]} {noun}."


_SPAN_KINDS = (_address, _phone, _called, _friends, _money, _named_counted, _room, _bus)


def span_texts(zh: str, en: str) -> set[str]:
    """The Latin names and Arabic numbers found in both `zh` and `en`: the spans a translation copies."""
    return set(_SPAN_TEXT.findall(zh)) & set(_SPAN_TEXT.findall(en))


def pairs(
    n: int, seed: int = 0, traditional: float = 0.2, spans: float = 0.0, held_out_from: int | None = None
) -> list[tuple[str, str]]:
    """n pairs with distinct English sides; a share `traditional` of them in Traditional characters,
    a share `spans` from the names-and-numbers grammar (no random draw is spent on it at 0, so the
    default pairs are those of the plain grammar alone). Pairs from index `held_out_from` on fill
    every name and number slot with an entry `held_out` of it, the pairs before with the others."""
    rng, seen, out = random.Random(seed), set(), []
    for _ in range(100 * n + 1000):
        if len(out) == n:
            return out
        if spans and rng.random() < spans:
            test = held_out_from is not None and len(out) >= held_out_from
            zh, en = rng.choice(_SPAN_KINDS)(rng, test)
        else:
            zh, en = rng.choice(_KINDS)(rng)
        if rng.random() < traditional:
            zh = zh.translate(_TRADITIONAL)
        if en not in seen:  # distinct English: no Simplified/Traditional twins across splits
            seen.add(en)
            out.append((zh, en))
    raise ValueError(f"the grammar has fewer than {n} distinct pairs")


_SYLLABLES = [c + v for c in "bdfghklmnprstvz" for v in ("a", "e", "i", "o", "u", "ai", "en", "or")]
_CJK_POOL = 3000  # U+4E00 onwards: common and rarer characters, Simplified and Traditional


def _noise_pair(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(3, 15)
    zh = "".join(chr(0x4E00 + int(rng.expovariate(1 / 400)) % _CJK_POOL) for _ in range(k)) + "。"
    words, size = [], 0
    while size < 3 * k:
        words.append("".join(rng.choice(_SYLLABLES) for _ in range(rng.randrange(1, 4))))
        size += len(words[-1]) + 1
    return zh, " ".join(words).capitalize() + "."


def vocab_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """Half `pairs(n // 2, seed)`, half random characters/pseudo-words, interleaved; distinct English."""
    rng, base = random.Random(seed + 1), pairs(n // 2, seed)
    noise: list[tuple[str, str]] = []
    seen = {en for _, en in base}
    while len(noise) < n - len(base):
        zh, en = _noise_pair(rng)
        if en not in seen:
            seen.add(en)
            noise.append((zh, en))
    return [p for pair in zip(base, noise, strict=False) for p in pair] + noise[len(base) :]


def script_code(zh: str) -> str:
    return "cmn_Hant" if _TRADITIONAL_ONLY & set(zh) else "cmn_Hans"


def _write_jsonl(path: Path, rows: list[tuple[str, str]]) -> None:
    lines = (json.dumps({"translation": {"zh": zh, "en": en}}, ensure_ascii=False) + "\n" for zh, en in rows)
    path.write_text("".join(lines), encoding="utf-8")


def write_plain(folder: Path, stem: str, rows: list[tuple[str, str]]) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    zh, en = folder / f"{stem}.zh", folder / f"{stem}.en"
    zh.write_text("".join(z + "\n" for z, _ in rows), encoding="utf-8")
    en.write_text("".join(e + "\n" for _, e in rows), encoding="utf-8")
    return zh, en


def write_mirror(
    root: Path,
    train: int = 2000,
    valid: int = 200,
    test: int = 200,
    seed: int = 0,
    subdir: str = "tatoeba-zh-en",
    rich: bool = False,
    spans: float = 0.0,
) -> Path:
    """A mirror directory like ../shared/data, made of `pairs(train + valid + test, seed, spans=spans)`
    (`vocab_pairs` with `rich`, which has no span grammar); returns root."""
    if rich and spans:
        raise ValueError("write_mirror: rich=True writes vocab_pairs, which have no span grammar")
    total = train + valid + test
    held = train + valid if spans else None  # the test split's spans sit in slots training never filled with them
    rows = vocab_pairs(total, seed) if rich else pairs(total, seed, spans=spans, held_out_from=held)
    folder = Path(root) / subdir
    folder.mkdir(parents=True, exist_ok=True)
    _write_jsonl(folder / "train.jsonl", rows[:train])
    _write_jsonl(folder / "validation.jsonl", rows[train : train + valid])
    _write_jsonl(folder / "test.jsonl", rows[train + valid :])
    codes = "".join(script_code(zh) + "\n" for zh, _ in rows[train + valid :])
    (folder / "test.codes.txt").write_text(codes, encoding="utf-8")
    return Path(root)


# --------------------------------------------------------------------------- in-memory datasets


class ListDataset:
    def __init__(self, pairs: list[tuple[list[int], list[int]]]) -> None:
        self.pairs = pairs
        self.src_lengths = np.array([len(s) for s, _ in pairs])
        self.tgt_lengths = np.array([len(t) for _, t in pairs])

    def __len__(self) -> int:
        return len(self.pairs)

    def pair(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        s, t = self.pairs[i]
        return np.array(s, dtype=np.int32), np.array(t, dtype=np.int32)
