"""nmt.data.passthrough: span rules, masking of training pairs, restoration of a model's mistakes, the score."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiers import trains

from nmt.config import PASSTHROUGH_KINDS, DataConfig, config_from_dict
from nmt.data.normalize import normalize_source
from nmt.data.passthrough import (
    CLOSE,
    MAX_SLOTS,
    OPEN,
    PLACEHOLDERS,
    Detector,
    Masked,
    mask,
    mask_pair,
    masker,
    passthrough_score,
    restore,
)
from nmt.errors import ConfigError

ALL = Detector(PASSTHROUGH_KINDS)

# (sentence as typed, spans found after normalisation: (text, kind) in order)
TABLE = [
    ("我爱 AI", [("AI", "latin")]),
    ("我买了iPhone15和一部5G手机。", [("iPhone15", "latin"), ("5G", "latin")]),
    ("COVID-19疫情从2020年开始。", [("COVID-19", "latin"), ("2020", "number")]),
    ("利率上调了3.5%。", [("3.5%", "number")]),
    ("今天来了1,000人。", [("1,000", "number")]),
    ("价格是3,5欧元。", [("3,5", "number")]),  # a decimal comma: one number
    ("2024年11月30日", [("2024", "number"), ("11", "number"), ("30", "number")]),
    ("请访问https://example.org/a?b=1，谢谢。", [("https://example.org/a?b=1", "url")]),
    ("网址是www.example.com。", [("www.example.com", "url")]),
    ("见 http://example.org/x.html.", [("http://example.org/x.html", "url")]),
    ("写信给tom@example.com。", [("tom@example.com", "email")]),
    ("运行`ls -la`命令", [("ls -la", "marked")]),
    ("ＡＩ和３Ｄ打印", [("AI", "latin"), ("3D", "latin")]),  # full-width forms: NFKC makes them ASCII
    ("他有三百块钱。", []),  # Chinese numerals are translated, not passed through
    ("Müller先生来自Zürich。", [("Müller", "latin"), ("Zürich", "latin")]),
    ("我在用Python 3.12和C++。", [("Python", "latin"), ("3.12", "number"), ("C", "latin")]),
    ("我喜欢吃苹果。", []),
    ("空的` `标记", []),  # nothing inside the backticks: no span
]


@pytest.mark.parametrize(("sentence", "expected"), TABLE)
def test_span_rules_on_real_looking_sentences(sentence, expected):
    text = normalize_source(sentence, DataConfig())
    spans = ALL.find(text)
    assert [(s.text, s.kind) for s in spans] == expected
    for s in spans:  # offsets point at the span (marked spans include their backticks)
        assert s.text in text[s.start : s.end]


def test_url_stops_before_chinese_punctuation_without_normalisation():
    assert [s.text for s in ALL.find("看https://example.org，然后。")] == ["https://example.org"]
    assert [s.text for s in ALL.find("看https://example.org。")] == ["https://example.org"]


def test_kinds_are_selectable_and_terms_win():
    text = "2024年我在https://a.org看到Hugging Face的AI"
    assert [s.text for s in Detector(["latin"]).find(text)] == ["https", "a", "org", "Hugging", "Face", "AI"]
    assert [s.text for s in Detector(["number", "url"]).find(text)] == ["2024", "https://a.org"]
    with_terms = Detector(["latin"], ["Hugging Face", "Hugging"])  # the longest term first
    assert [(s.text, s.kind) for s in with_terms.find(text)][-2:] == [("Hugging Face", "marked"), ("AI", "latin")]
    assert Detector([]).find(text) == []


def test_mask_shares_slots_for_equal_texts_and_caps_them():
    m = mask("Tom和Tom在2024年", ALL.find("Tom和Tom在2024年"))
    assert m.text == f"{PLACEHOLDERS[0]}和{PLACEHOLDERS[0]}在{PLACEHOLDERS[1]}年"
    assert (m.slots, m.counts) == (["Tom", "2024"], [2, 1])
    many = " ".join(f"w{i}" for i in range(MAX_SLOTS + 3))
    capped = mask(many, ALL.find(many))
    assert len(capped.slots) == MAX_SLOTS and capped.text.endswith(f"w{MAX_SLOTS} w{MAX_SLOTS + 1} w{MAX_SLOTS + 2}")


@pytest.mark.parametrize(("sentence", "_"), TABLE)
def test_round_trip_restores_every_span(sentence, _):
    text = normalize_source(sentence, DataConfig())
    spans = ALL.find(text)
    m = mask(text, spans)
    expected = text
    for s in reversed(spans):  # marked spans lose their backticks
        expected = expected[: s.start] + s.text + expected[s.end :]
    assert OPEN not in restore(m.text, m) and CLOSE not in restore(m.text, m)
    assert restore(m.text, m) == " ".join(expected.split())


def test_training_pairs_are_masked_only_where_both_sides_agree():
    src, tgt = mask_pair("我在2024年见过Tom，他有3个iPhone。", "I met Tom in 2024. He has three iPhones.", ALL)
    p = PLACEHOLDERS
    assert src.text == f"我在{p[0]}年见过{p[1]}，他有3个iPhone。"  # 3 and iPhone: not on the English side
    assert tgt == f"I met {p[1]} in {p[0]}. He has three iPhones."  # same text, same placeholder
    assert src.slots == ["2024", "Tom"]
    untouched = mask_pair("他13岁。", "He is 3 or 13.", Detector(["latin"]))
    assert (untouched[0].text, untouched[1]) == ("他13岁。", "He is 3 or 13.")
    partial = mask_pair("他13岁。", "He is 3 or 13.", ALL)  # "3" is not a span of the source: 13 is
    assert (partial[0].text, partial[1]) == (f"他{p[0]}岁。", f"He is 3 or {p[0]}.")


SLOTS = Masked(f"{PLACEHOLDERS[0]}喜欢{PLACEHOLDERS[1]}", ["Tom", "AI"], [1, 1])


@pytest.mark.parametrize(
    ("output", "restored"),
    [
        (f"{PLACEHOLDERS[0]} likes {PLACEHOLDERS[1]}.", "Tom likes AI."),  # all good
        (f"{PLACEHOLDERS[0]} likes it.", "Tom likes it AI."),  # dropped: appended before the final stop
        ("He likes it", "He likes it Tom AI"),  # all dropped, no final punctuation
        (f"{PLACEHOLDERS[0]} {PLACEHOLDERS[0]} likes {PLACEHOLDERS[1]}!", "Tom likes AI!"),  # repeated: first kept
        (f"{PLACEHOLDERS[0]} likes {PLACEHOLDERS[7]} {PLACEHOLDERS[1]}.", "Tom likes AI."),  # invented: removed
        (f"{OPEN}{PLACEHOLDERS[0]} likes {PLACEHOLDERS[1]}{CLOSE}.", "Tom likes AI."),  # stray fragments
        ("", "Tom AI"),
    ],
)
def test_restore_handles_every_model_mistake(output, restored):
    assert restore(output, SLOTS) == restored


def test_restore_inserts_span_text_literally():
    m = Masked(PLACEHOLDERS[0], [PLACEHOLDERS[1]], [1])  # a span that looks like a placeholder
    assert restore(f"x {PLACEHOLDERS[0]} {PLACEHOLDERS[1]}", m) == f"x {PLACEHOLDERS[1]}"


def test_score_counts_spans_shared_by_source_and_reference():
    sources = ["我在2024年见过Tom。", "他有3个苹果。", "没有。"]
    refs = ["I met Tom in 2024.", "He has three apples.", "No."]
    hyps = ["I saw Tom in 2023.", "He has 3 apples.", "No."]
    assert passthrough_score(sources, refs, hyps, ALL) == {"spans": 2, "kept": 1, "accuracy": 0.5}
    assert passthrough_score(["没有。"], ["No."], ["No."], ALL)["accuracy"] is None


class _Tok:
    def __init__(self, pieces: set[str]):
        self.pieces = pieces

    def has_pieces(self, pieces):
        return all(p in self.pieces for p in pieces)


def test_masker_needs_the_feature_and_placeholders_in_both_vocabularies():
    data, full = DataConfig(), _Tok(set(PLACEHOLDERS))
    assert masker(data, full, full) is not None
    assert masker(data, full, _Tok(set(PLACEHOLDERS[:-1]))) is None  # a vocabulary trained without them
    assert masker(data, full, object()) is None
    assert masker(DataConfig(passthrough=[]), full, full) is None


def test_config_kinds_and_terms():
    cfg = config_from_dict({"data": {"passthrough": "latin, url", "protected_terms": ["Hugging Face"]}})
    assert cfg.data.passthrough == ["latin", "url"] and cfg.data.protected_terms == ["Hugging Face"]
    assert config_from_dict({"data": {"passthrough": []}}).data.passthrough == []
    assert config_from_dict({}).data.passthrough == list(PASSTHROUGH_KINDS)
    with pytest.raises(ConfigError, match=r"data\.passthrough: unknown kind 'numbers' \(did you mean 'number'\?\)"):
        config_from_dict({"data": {"passthrough": ["latin", "numbers"]}})
    with pytest.raises(ConfigError, match=r"data\.passthrough: expected list"):
        config_from_dict({"data": {"passthrough": 3}})
    with pytest.raises(ConfigError, match=r"data\.protected_terms"):
        config_from_dict({"data": {"protected_terms": [" padded"]}})


# --------------------------------------------------------------------------- end to end, on self-made data

TEMPLATES = [  # (zh, en): {w} a Latin-script word, {n} a number
    ("我爱 {w}", "I love {w}."),
    ("我不喜欢{w}。", "I don't like {w}."),
    ("{w}很好。", "{w} is good."),
    ("我有{n}个苹果。", "I have {n} apples."),
    ("他在{n}年去了北京。", "He went to Beijing in {n}."),
    ("你好。", "Hello."),
]


def synthetic_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """Template pairs filled with random words and numbers (none of them "AI")."""
    import random

    rng, letters = random.Random(seed), "bcdefghjkmnopqrstuvwxyzBCDEFGHJKLMNOPQRSTUVWXYZ"
    out = []
    for _ in range(n):
        zh, en = rng.choice(TEMPLATES)
        w, num = "".join(rng.choices(letters, k=rng.randint(2, 7))), str(rng.randint(1, 3000))
        out.append((zh.format(w=w, n=num), en.format(w=w, n=num)))
    return out


@pytest.fixture(scope="module")
@trains
def synthetic_run(tmp_path_factory) -> Path:
    """A tiny model trained with pass-through on template pairs (about half a minute on one core)."""
    from nmt.config import load_config, save_config
    from nmt.data.vocab import build_vocab
    from nmt.train.loop import train

    run = tmp_path_factory.mktemp("pt") / "run"
    (run / "corpus").mkdir(parents=True)
    for split, n, seed in (("train", 2000, 1), ("valid", 60, 2), ("test", 60, 3)):
        pairs = synthetic_pairs(n, seed)
        for side, lang in enumerate(("zh", "en")):
            (run / "corpus" / f"{split}.{lang}").write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    root = Path(__file__).resolve().parents[2]
    config = load_config(
        root / "configs" / "tiny.yaml",
        ["vocab.src_size=300", "vocab.tgt_size=120", "model.d_model=64", "model.ffn_dim=128", "train.threads=1",
         "train.max_steps=150", "train.eval_every=150", "train.lr=0.005", "decode.beam=1"],
    )  # fmt: skip
    save_config(config, run / "config.yaml")
    build_vocab(config, run)
    train(config, run)
    return run


@pytest.mark.slow
def test_vocab_trains_and_encodes_masked_pairs_and_keeps_the_corpus_raw(synthetic_run):
    import json

    from nmt.config import load_config
    from nmt.data.encoded import ParallelSplit
    from nmt.data.tokenizer import load_tokenizers

    config = load_config(synthetic_run / "config.yaml")
    stats = json.loads((synthetic_run / "vocab.stamp.json").read_text(encoding="utf-8"))["report"]["passthrough"]
    zh, en = (
        (synthetic_run / "corpus" / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("zh", "en")
    )
    expected = [mask_pair(z, e, ALL) for z, e in zip(zh, en, strict=True)]
    assert stats["train"] == {"pairs": 2000, "masked_pairs": sum(bool(m.slots) for m, _ in expected)}
    assert stats["train"]["masked_pairs"] > 1500  # all templates but one hold a word or a number
    assert not any(OPEN in line for line in zh + en)  # corpus/ stays raw
    src, tgt = load_tokenizers(synthetic_run, config)
    train = ParallelSplit.open(synthetic_run, "train", config)
    for i in range(0, 2000, 97):
        ids_src, ids_tgt = train.pair(i)
        assert src.decode(ids_src.tolist()) == expected[i][0].text and tgt.decode(ids_tgt.tolist()) == expected[i][1]


@pytest.mark.slow
def test_model_trained_with_passthrough_copies_an_unseen_word(synthetic_run):
    from typer.testing import CliRunner

    from nmt.cli import app
    from nmt.decode.translator import Translator

    t = Translator.from_run(synthetic_run)
    assert t.masker is not None
    ids = t.encode_sources(["我爱 AI"])
    tokens = t.engine.search(ids, 1, 1, 1.0, True)[0][0][0]
    assert t.tgt_tok.piece(tokens[-1]) == "." and PLACEHOLDERS[0] in [t.tgt_tok.piece(i) for i in tokens]  # learnt
    result = CliRunner().invoke(app, ["translate", "--run", str(synthetic_run), "我爱 AI", "他在2024年去了北京。"])
    assert result.exit_code == 0, result.output
    love, went = result.stdout.splitlines()
    assert love == "I love AI." and "Beijing" in went and "2024" in went


def test_a_source_without_spans_leaves_the_target_unscanned_and_unmasked(monkeypatch):
    """The cheap path of `mask_pair` (most pairs): no source span, so nothing can be shared."""
    scanned = []
    find = Detector.find
    monkeypatch.setattr(
        Detector, "find", lambda self, text, among=None: scanned.append(text) or find(self, text, among)
    )
    src, tgt = "他在家里看书。", "He reads Harry Potter at home in 2024."
    masked, out = mask_pair(src, tgt, ALL)
    assert (masked.text, masked.slots, out) == (src, [], tgt) and scanned == [src]
    masked, out = mask_pair("他在2024年读书。", tgt, ALL)  # a shared number: both sides scanned and masked
    assert masked.slots == ["2024"] and "2024" not in out and len(scanned) == 3


def test_text_without_latin_digits_or_backticks_holds_no_span_unless_a_term_is_protected():
    assert ALL.find("他在家里看书，很开心。") == []
    assert [s.text for s in ALL.find("他在家里看书2本。")] == ["2"]
    with_term = Detector(PASSTHROUGH_KINDS, terms=["北京大学"])
    assert [(s.text, s.kind) for s in with_term.find("他在北京大学看书。")] == [("北京大学", "marked")]


@pytest.mark.parametrize("latin_source", [False, True])
def test_find_among_texts_is_find_filtered(latin_source):
    """`find(text, among=...)` (how a target is scanned for its source's spans) gives the spans of
    `find(text)` whose text is among them, whatever their rule."""
    detector = Detector(PASSTHROUGH_KINDS, terms=["Open AI"], latin_source=latin_source)
    text = "See `ls -l` at https://a.org/x, mail a@b.cn: AI, iPhone15 and COVID-19 cost 3.5% of 1,000 Open AI."
    every = detector.find(text)
    for among in [
        set(),
        {"AI"},
        {"ls -l", "https://a.org/x", "a@b.cn"},
        {"3.5%", "1,000", "Open AI", "AIs"},
        {s.text for s in every},
    ]:
        assert detector.find(text, among=among) == [s for s in every if s.text in among]


def test_may_hold_names_exactly_the_lines_a_span_rule_can_match():
    lines = ["他在家里看书。", "我爱 AI", "", "今天来了1,000人。", "没有。", "用`ls`看看", "北京大学很大。", "3"]
    assert ALL.may_hold(lines) == [1, 3, 5, 7]
    assert ALL.may_hold(lines) == [i for i, line in enumerate(lines) if ALL.find(line)]
    with_term = Detector(PASSTHROUGH_KINDS, terms=["北京大学"])
    assert with_term.may_hold(lines) == list(range(len(lines)))  # a term may be any text
    assert Detector([]).may_hold(lines) == [] and ALL.may_hold([]) == []


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("data", [DataConfig(), DataConfig(passthrough_unmasked=0.5), DataConfig(passthrough=[])])
def test_preparing_lines_is_preparing_each_pair(raw, data):
    """`PairPrep.lines` (what the encoding workers call on a chunk) gives what `PairPrep` gives pair
    by pair, for train (the lines without a span-rule character skipped) and valid/test (raw)."""
    from nmt.data.passthrough import PairPrep

    pairs = [(f"他{n}岁，住在{n}号。", f"He is {n} and lives at number {n}.") for n in range(300)]
    pairs += [("他在家里看书。", "He reads at home."), ("我爱 AI", "I love AI"), ("全角ＡＩ和２０２４", "AI and 2024")]
    prep = PairPrep(data, raw)
    src, tgt, changed = prep.lines([p[0] for p in pairs], [p[1] for p in pairs])
    one_by_one = [prep(*p) for p in pairs]
    assert list(zip(src, tgt, strict=True)) == [d[:2] for d in one_by_one]
    assert changed == sum(d[2] for d in one_by_one) and (changed > 0) == bool(data.passthrough)


# --------------------------------------------------------------------------- unmasked training pairs


def test_a_seeded_share_of_training_pairs_stays_unmasked_and_the_same_on_every_call():
    from nmt.data.passthrough import PairPrep, left_unmasked

    pairs = [(f"我在{n}年买了一部iPhone。", f"I bought an iPhone in {n}.") for n in range(2000, 4000)]
    data = DataConfig(passthrough_unmasked=0.25)
    chosen = [left_unmasked(s, t, data) for s, t in pairs]
    assert 0.2 < sum(chosen) / len(chosen) < 0.3
    assert chosen == [left_unmasked(s, t, DataConfig(passthrough_unmasked=0.25)) for s, t in pairs]  # resumable
    other_seed = [left_unmasked(s, t, DataConfig(passthrough_unmasked=0.25, seed=2)) for s, t in pairs]
    assert other_seed != chosen
    assert not any(left_unmasked(s, t, DataConfig()) for s, t in pairs)  # 0: every pair masked, as before

    train, valid = PairPrep(data, raw=False), PairPrep(data, raw=True)
    for (s, t), raw in zip(pairs[:200], chosen[:200], strict=True):
        src, tgt, changed = train(s, t)
        assert (src == s and tgt == t and not changed) if raw else (src != s and changed)
        assert valid(s, t)[2]  # valid and test are always masked: nmt's runtimes mask
    no_span = ("我爱你。", "I love you.")
    assert PairPrep(DataConfig(passthrough_unmasked=1.0), raw=False)(*no_span) == (*no_span, False)


def test_the_unmasked_share_is_checked_at_load():
    with pytest.raises(ConfigError, match="data.passthrough_unmasked: must be in"):
        config_from_dict({"data": {"passthrough_unmasked": 1.5}})
