"""nmt.data.vocab_sample: the seeded, character-budgeted, order-free sample SentencePiece trains on."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from nmt.data.vocab_sample import BottomK, draw_vocab_sample, pair_key
from nmt.errors import NmtError


def brute_force(items: list[tuple[int, str]], budget: int, max_lines: int) -> list[str]:
    """The definition: lines by key, the shortest prefix reaching `budget` characters, at most `max_lines`."""
    out, chars = [], 0
    for _, line in sorted(items):
        if chars >= budget or len(out) >= max_lines:
            break
        out.append(line)
        chars += len(line)
    return out


def random_lines(n: int, seed: int) -> list[tuple[int, str]]:
    rng = random.Random(seed)
    return [(rng.getrandbits(64), "x" * rng.randint(0, 40) + str(i)) for i in range(n)]


@pytest.mark.parametrize(("budget", "max_lines"), [(500, 10_000), (10**9, 10_000), (5000, 37), (1, 5)])
def test_bottom_k_is_the_smallest_keys_up_to_the_budget(budget, max_lines):
    items = random_lines(2000, seed=budget)
    sample = BottomK(budget, max_lines)
    for key, line in items:
        sample.add(key, line)
    assert sample.lines() == brute_force(items, budget, max_lines)
    assert sample.chars == sum(map(len, sample.lines()))


def test_bottom_k_holds_no_more_than_the_budget_and_one_line_while_streaming():
    """Its memory is the sample's: never more than budget + one line's characters, however long the stream."""
    sample, longest = BottomK(budget=300, max_lines=10**6), 0
    for key, line in random_lines(20_000, seed=1):
        sample.add(key, line)
        longest = max(longest, len(line))
        assert sample.chars < 300 + longest
    assert sample.chars >= 300


def write_pairs(folder: Path, pairs: list[tuple[str, str]]) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = (folder / "train.zh", folder / "train.en")
    for i, path in enumerate(paths):
        path.write_text("".join(p[i] + "\n" for p in pairs), encoding="utf-8")
    return paths


PAIRS = [(f"第{i}句话{'很' * (i % 7)}长。", f"Sentence number {i} is {'very ' * (i % 5)}long.") for i in range(3000)]


def test_sample_does_not_depend_on_the_order_of_the_pairs(tmp_path):
    shuffled = PAIRS[:]
    random.Random(3).shuffle(shuffled)
    outs = []
    for name, pairs in (("a", PAIRS), ("b", shuffled)):
        texts = write_pairs(tmp_path / name, pairs)
        out = (tmp_path / name / "sample.zh", tmp_path / name / "sample.en")
        stats = draw_vocab_sample(texts, out, budget=4000, max_lines=10**6, seed=1)
        outs.append([p.read_bytes() for p in out])
    assert outs[0] == outs[1]
    zh, en = (outs[0][i].decode().splitlines() for i in (0, 1))
    assert 4000 <= stats[0]["chars"] == sum(map(len, zh)) < 4000 + max(len(z) for z, _ in PAIRS)
    assert stats[1]["sentences"] == len(en) < len(zh) < 3000 and stats[1]["of_sentences"] == 3000  # en is longer
    keys = {z: pair_key(z.encode(), e.encode(), 1) for z, e in PAIRS}
    assert [keys[z] for z in zh] == sorted(keys[z] for z in zh)  # in key order
    assert max(keys[z] for z in zh) < min(k for z, k in keys.items() if z not in set(zh))  # the smallest keys
    assert {z for z, e in PAIRS if e in set(en)} <= set(zh)  # both sides rank pairs by the same key


def test_another_seed_draws_another_sample(tmp_path):
    texts = write_pairs(tmp_path, PAIRS)
    samples = []
    for seed in (1, 2):
        out = (tmp_path / f"s{seed}.zh", tmp_path / f"s{seed}.en")
        draw_vocab_sample(texts, out, budget=4000, max_lines=10**6, seed=seed)
        samples.append(set(out[0].read_text(encoding="utf-8").splitlines()))
    assert samples[0] != samples[1] and len(samples[0] & samples[1]) < len(samples[0]) // 2


def test_the_whole_corpus_when_it_is_under_the_budget(tmp_path):
    texts = write_pairs(tmp_path, PAIRS[:50])
    out = (tmp_path / "s.zh", tmp_path / "s.en")
    stats = draw_vocab_sample(texts, out, budget=10**9, max_lines=10**6, seed=1)
    assert sorted(out[1].read_text(encoding="utf-8").splitlines()) == sorted(e for _, e in PAIRS[:50])
    assert stats[1] == {"sentences": 50, "chars": sum(len(e) for _, e in PAIRS[:50]), "of_sentences": 50}


def test_a_side_limited_to_its_first_lines_never_sees_the_rest(tmp_path):
    """`firsts` (the real pairs before back-translated ones): the source side is drawn from the
    first 30 lines only, the target side from all; within its lines, the same sample as a file
    of those lines alone."""
    texts = write_pairs(tmp_path, PAIRS[:50])
    out = (tmp_path / "s.zh", tmp_path / "s.en")
    stats = draw_vocab_sample(texts, out, budget=10**9, max_lines=10**6, seed=1, firsts=(30, None))
    assert sorted(out[0].read_text(encoding="utf-8").splitlines()) == sorted(z for z, _ in PAIRS[:30])
    assert sorted(out[1].read_text(encoding="utf-8").splitlines()) == sorted(e for _, e in PAIRS[:50])
    assert stats[0]["sentences"] == 30 and stats[0]["of_sentences"] == 50
    small = (tmp_path / "t.zh", tmp_path / "t.en")
    draw_vocab_sample(texts, small, budget=200, max_lines=10**6, seed=1, firsts=(30, None))
    alone = write_pairs(tmp_path / "alone", PAIRS[:30])
    draw_vocab_sample(alone, (tmp_path / "u.zh", tmp_path / "u.en"), budget=200, max_lines=10**6, seed=1)
    assert small[0].read_bytes() == (tmp_path / "u.zh").read_bytes()


@pytest.mark.parametrize("longer", [0, 1])
def test_unaligned_sides_are_an_error_naming_the_file(tmp_path, longer):
    texts = write_pairs(tmp_path, PAIRS[:20])
    with open(texts[longer], "a", encoding="utf-8") as f:
        f.write("one more\n")
    with pytest.raises(NmtError, match=r"train\.en: not as many lines as .*train\.zh \(2[01]\)"):
        draw_vocab_sample(texts, (tmp_path / "s.zh", tmp_path / "s.en"), budget=100, max_lines=10, seed=1)
    assert not (tmp_path / "s.zh").exists()


def test_a_line_that_is_not_utf8_is_an_error_naming_file_and_line(tmp_path):
    texts = write_pairs(tmp_path, PAIRS[:20])
    raw = texts[1].read_bytes().split(b"\n")
    raw[6] = b"caf\xe9"
    texts[1].write_bytes(b"\n".join(raw))
    with pytest.raises(NmtError, match=r"train\.en:7: not UTF-8"):
        draw_vocab_sample(texts, (tmp_path / "s.zh", tmp_path / "s.en"), budget=10**6, max_lines=100, seed=1)
