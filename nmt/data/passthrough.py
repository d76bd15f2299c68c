"""Pass-through spans: what a translation must carry over unchanged, hidden from the model.

Spans are found by rules on *normalised* text (`nmt.data.corpus.normalize_source` /
`normalize_target`: NFKC, so full-width `３` or `ＡＩ` is already `3` / `AI`), tried left to
right, the first rule that matches at a position wins:

    marked  text in backticks, `like this` (the span is the text inside; the backticks go),
            and every `data.protected_terms` entry (case-sensitive, longest first)
    url     http://, https://, ftp:// or www. up to a space or any non-ASCII character (so a
            following Chinese "，。" ends it), minus trailing ASCII punctuation .,;:!?)]}'"
    email   name@domain.tld
    latin   a token of Latin letters (ASCII and Latin-1/Extended) and digits holding at least
            one letter: "AI", "iPhone15", "5G", "COVID-19", "Müller". Where the source is in
            Latin script (en→zh) only the tokens a translation copies: with a digit or a
            capital after the first letter ("AI", "iPhone", "5G"); "Tom" or "table" translate.
    number  a token of digits: "2024" (of "2024年"), "1,000", "3.5%", "3,5", "2024/11/30"

A token is letters/digits joined by `-`, `&`, `+`, `/`, and `.` or `,` between two digits;
a number may end in `%`. Chinese numerals (三百) are no span: they are translated. Kinds not
in `data.passthrough` are not looked for (a URL is then just tokens).

Masking replaces each span by a placeholder `⦅i⦆` (`i` < MAX_SLOTS, in order of first
appearance; equal texts share one placeholder; spans beyond MAX_SLOTS stay text). The
placeholders are user-defined symbols of both SentencePiece models, so they are never split.

Training (`mask_pair`): a source span is masked only where a span with the same text is found
by the same rules in the target; then both sides get the same placeholder. This is also the
meaning of "the same span on both sides" in the pass-through score. corpus/ stays raw: pairs
are masked (`PairPrep`) as SentencePiece's sample is drawn and as the encoding workers encode them.

Restoration (`restore`), the documented rule for a model's mistakes:
  - placeholder i appears as often as in the source: each becomes slot i's text;
  - repeated more often than in the source: the extra copies are removed;
  - invented (no slot i) or a stray `⦅`/`⦆` fragment: removed (with the whitespace before it
    when a space, punctuation or the end follows, so "a ⦅7⦆, b" gives "a, b");
  - dropped (slot i never produced): its text is appended at the end, in slot order, before a
    final `.`, `!` or `?`.
No placeholder character of the model's output reaches the user; whitespace is collapsed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from nmt.config import PASSTHROUGH_KINDS, DataConfig

MAX_SLOTS = 10
OPEN, CLOSE = "⦅", "⦆"  # U+2985/U+2986: NFKC-stable (they are what ｟｠ normalise to)
PLACEHOLDERS = tuple(f"{OPEN}{i}{CLOSE}" for i in range(MAX_SLOTS))
_MODEL_PLACEHOLDER = re.compile(f"{OPEN}(\\d+){CLOSE}|[{OPEN}{CLOSE}]")
# in output: (space before)(placeholder | fragment)(a following space, punctuation or end, if any)
_OUTPUT_PLACEHOLDER = re.compile(f"(\\s*)(?:{_MODEL_PLACEHOLDER.pattern})(?=([\\s.,!?;:)\\]]|$)?)")

_L = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f"  # Latin letters (ASCII, Latin-1, Extended-A/B)
_W = f"[{_L}0-9]"
_JOIN = r"(?:[-&+/]|(?<=\d)[.,](?=\d))"
_RULES = {
    "url": r"(?:https?://|ftp://|www\.)[!-~]+",
    "email": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+",
    "token": f"{_W}+(?:{_JOIN}{_W}+)*%?",
}
_URL_TAIL = ".,;:!?)]}'\""
_HAS_LETTER = re.compile(f"[{_L}]")
# in a Latin-script source (en→zh) the Latin tokens a translation copies: with a digit ("5G",
# "COVID-19") or a capital after the first letter ("AI", "iPhone"); "Tom", "hello" are translated
_COPIED = re.compile(r"\d|.[A-Z]")


@dataclass(frozen=True)
class Span:
    start: int  # character offsets in the (normalised) text
    end: int
    text: str  # what the translation must contain (marked text without its backticks)
    kind: str  # one of nmt.config.PASSTHROUGH_KINDS


class Detector:
    """The span rules for a set of kinds and protected terms, compiled once."""

    def __init__(self, kinds: Iterable[str], terms: Iterable[str] = (), latin_source: bool = False) -> None:
        """`latin_source`: the source is written in Latin script (en→zh), where every word is a
        Latin token: only those a translation copies are spans there (`_COPIED`)."""
        self.kinds, self.latin_source = frozenset(kinds), latin_source
        parts = []
        if "marked" in self.kinds:
            parts.append(r"(?P<marked>`[^`\n]+`)")
        if terms := sorted(set(terms), key=len, reverse=True):
            parts.append(f"(?P<term>{'|'.join(map(re.escape, terms))})")
        parts += [f"(?P<{k}>{_RULES[k]})" for k in ("url", "email") if k in self.kinds]
        if self.kinds & {"latin", "number"}:
            parts.append(f"(?P<token>{_RULES['token']})")
        self.pattern = re.compile("|".join(parts)) if parts else None
        # every span without protected terms holds a Latin letter, a digit or a backtick: a text
        # with none (most Chinese sentences) is passed over by this one character class
        self._can_hold = None if terms else re.compile(f"[{_L}0-9`]")

    @classmethod
    def from_data(cls, data: DataConfig) -> Detector:
        return cls(data.passthrough, data.protected_terms if data.passthrough else (), data.src_lang != "zh")

    def may_hold(self, lines: list[str]) -> list[int]:
        """Indices of `lines` that may hold a span (every one with protected terms): one search of
        the character class per line, in C, so that a line without a Latin letter, digit or
        backtick (most Chinese lines) costs no Python step of `find`."""
        if self.pattern is None:
            return []
        if self._can_hold is None:
            return list(range(len(lines)))
        search = self._can_hold.search
        return [i for i, line in enumerate(lines) if search(line)]

    def find(self, text: str, among: Collection[str] | None = None) -> list[Span]:
        """Non-overlapping spans of `text`, left to right; with `among`, only those whose text is
        one of it (the same spans, filtered: an English target, where every word is a Latin token,
        is then scanned without a Python step a word)."""
        if self.pattern is None or (self._can_hold is not None and not self._can_hold.search(text)):
            return []
        spans = []
        for m in self.pattern.finditer(text):
            if among is not None and m.lastgroup == "token" and m.group() not in among:
                continue  # a token's span text is the match itself
            span = self._span(m)
            if span is not None and (among is None or span.text in among):
                spans.append(span)
        return spans

    def _span(self, m: re.Match) -> Span | None:
        rule, start, end = m.lastgroup, m.start(), m.end()
        if rule == "marked":  # the span is what the backticks enclose
            inner = m.group()[1:-1].strip()
            return Span(start, end, inner, "marked") if inner else None
        if rule == "term":
            return Span(start, end, m.group(), "marked")
        if rule == "url":
            end = start + len(m.group().rstrip(_URL_TAIL))
            return Span(start, end, m.string[start:end], "url")
        if rule == "email":
            return Span(start, end, m.group(), "email")
        kind = "latin" if _HAS_LETTER.search(m.group()) else "number"
        if kind == "latin" and self.latin_source and not _COPIED.search(m.group()):
            return None  # an ordinary word of a Latin-script source: translated, not copied
        return Span(start, end, m.group(), kind) if kind in self.kinds else None


# --------------------------------------------------------------------------- masking and restoring


@dataclass
class Masked:
    """A masked text and what its placeholders stand for."""

    text: str  # with ⦅i⦆ in place of the spans
    slots: list[str] = field(default_factory=list)  # slot i → the text ⦅i⦆ restores
    counts: list[int] = field(default_factory=list)  # slot i → how often ⦅i⦆ occurs in `text`


def mask(text: str, spans: list[Span]) -> Masked:
    """Replace `spans` (non-overlapping, sorted) by placeholders; equal texts share one slot."""
    index: dict[str, int] = {}
    out, pos, counts = [], 0, []
    for s in spans:
        i = index.get(s.text)
        if i is None:
            if len(index) >= MAX_SLOTS:
                continue  # beyond the reserved placeholders the span stays text
            i = index[s.text] = len(index)
            counts.append(0)
        out += [text[pos : s.start], PLACEHOLDERS[i]]
        counts[i] += 1
        pos = s.end
    out.append(text[pos:])
    return Masked("".join(out), list(index), counts)


def mask_pair(src: str, tgt: str, detector: Detector) -> tuple[Masked, str]:
    """(masked source, masked target) of a training pair: only spans found on both sides are masked."""
    src_spans = detector.find(src)
    if not src_spans:  # most sources: nothing to share, and the target (every English word a match) is not scanned
        return Masked(src), tgt
    tgt_spans = detector.find(tgt, among={s.text for s in src_spans})
    shared = {s.text for s in tgt_spans}
    if not shared:
        return Masked(src), tgt
    m = mask(src, [s for s in src_spans if s.text in shared])
    slot_of = {t: i for i, t in enumerate(m.slots)}
    t = mask(tgt, [s for s in tgt_spans if s.text in slot_of])
    renumber = {PLACEHOLDERS[j]: PLACEHOLDERS[slot_of[text]] for j, text in enumerate(t.slots)}
    tgt_masked = _MODEL_PLACEHOLDER.sub(lambda x: renumber.get(x.group(), x.group()), t.text)
    return m, tgt_masked


def restore(output: str, masked: Masked) -> str:
    """The model's `output` with every placeholder resolved by the module's restoration rule."""
    used = [0] * len(masked.slots)

    def fill(m: re.Match) -> str:
        i = int(m.group(2)) if m.group(2) is not None else -1
        if 0 <= i < len(masked.slots) and used[i] < masked.counts[i]:
            used[i] += 1
            return m.group(1) + masked.slots[i]
        return "" if m.group(3) is not None else m.group(1)  # invented, repeated or a fragment: removed

    text = " ".join(_OUTPUT_PLACEHOLDER.sub(fill, output).split())
    missing = [s for s, n in zip(masked.slots, used, strict=True) if n == 0]
    if not missing:
        return text
    end = len(text) - 1 if text.endswith((".", "!", "?")) else len(text)
    return " ".join([text[:end].rstrip(), *missing]).strip() + text[end:]


def masker(data: DataConfig, *tokenizers: object) -> Detector | None:
    """The detector to mask with, or None: pass-through off, or a vocabulary without placeholders
    (a run trained before this feature, or with it off), whose model never saw them."""
    if not data.passthrough:
        return None
    for tok in tokenizers:
        has = getattr(tok, "has_pieces", None)
        if has is None or not has(PLACEHOLDERS):
            return None
    return Detector.from_data(data)


# --------------------------------------------------------------------------- the score


def score_detector(data: DataConfig) -> Detector:
    """The detector the score finds spans with: the run's kinds, or every kind when pass-through is
    off, so that runs with and without the feature are scored on the same spans."""
    return Detector(data.passthrough or PASSTHROUGH_KINDS, data.protected_terms)


def shared_spans(detector: Detector, src: str, ref: str) -> set[str]:
    """The distinct span texts of a (normalised) source also found, by the same rules, in its reference."""
    return {s.text for s in detector.find(src)} & {s.text for s in detector.find(ref)}


def passthrough_score(sources: list[str], refs: list[str], hyps: list[str], detector: Detector) -> dict:
    """Of the distinct span texts of each source also found (by the same rules) in its reference,
    the share also found in the hypothesis. Texts must already be normalised."""
    total = kept = 0
    for src, ref, hyp in zip(sources, refs, hyps, strict=True):
        wanted = shared_spans(detector, src, ref)
        total += len(wanted)
        kept += len(wanted & {s.text for s in detector.find(hyp)})
    return {"spans": total, "kept": kept, "accuracy": kept / total if total else None}


def score_lines(data: DataConfig, sources: list[str], refs: list[str], hyps: list[str]) -> dict:
    """`passthrough_score` of raw lines, each normalised as its side is in training.

    Spans are those of `score_detector`.
    """
    from nmt.data.normalize import normalize_source, normalize_target

    detector = score_detector(data)
    return passthrough_score(
        [normalize_source(s, data) for s in sources],
        [normalize_target(r, data) for r in refs],
        [normalize_target(h, data) for h in hyps],
        detector,
    )


def describe(score: dict) -> str:
    """'pass-through 95.0% (38 of 40 spans kept)' for reports."""
    if not score.get("spans"):
        return "pass-through n/a (no source span found in its reference)"
    return f"pass-through {score['accuracy']:.1%} ({score['kept']} of {score['spans']} spans kept)"


# --------------------------------------------------------------------------- corpus pairs


class PairPrep:
    """What a pair of corpus lines becomes before SentencePiece sees it: normalised first when
    `raw` (valid/test keep their raw references in corpus/; train is normalised already), then
    masked when pass-through is on, except, in train, the pairs `left_unmasked` picks
    (`data.passthrough_unmasked`): those teach the model to copy spans from raw text. Picklable,
    so that the encoding workers and the vocabulary's sample draw (`nmt.data.vocab_sample`) run it
    where the pairs are (nothing is written to disk); the detector is compiled once per process, on
    first use."""

    def __init__(self, data: DataConfig, raw: bool) -> None:
        self.data, self.raw = data, raw
        self._detector: Detector | None = None

    @property
    def masks(self) -> bool:
        return bool(self.data.passthrough)

    def __getstate__(self) -> dict:
        return {"data": self.data, "raw": self.raw, "_detector": None}

    def lines(self, src: list[str], tgt: list[str]) -> tuple[list[str], list[str], int]:
        """`__call__` over aligned lines: (sources, targets, how many pairs were masked). In train,
        only the pairs whose source may hold a span (`Detector.may_hold`) are looked at: most
        Chinese lines hold no Latin letter or digit, and they pass through without a Python call."""
        if self.raw or not self.masks:
            done = [self(s, t) for s, t in zip(src, tgt, strict=True)]
            return [d[0] for d in done], [d[1] for d in done], sum(d[2] for d in done)
        if self._detector is None:
            self._detector = Detector.from_data(self.data)
        src, tgt, changed = list(src), list(tgt), 0
        for i in self._detector.may_hold(src):
            src[i], tgt[i], masked = self(src[i], tgt[i])
            changed += masked
        return src, tgt, changed

    def __call__(self, src: str, tgt: str) -> tuple[str, str, bool]:
        """(source, target, whether a span was masked)."""
        if self.raw:
            from nmt.data.normalize import normalize_source, normalize_target

            src, tgt = normalize_source(src, self.data), normalize_target(tgt, self.data)
        if not self.masks:
            return src, tgt, False
        if self._detector is None:
            self._detector = Detector.from_data(self.data)
        masked, out = mask_pair(src, tgt, self._detector)
        if masked.slots and not self.raw and left_unmasked(src, tgt, self.data):
            return src, tgt, False
        return masked.text, out, bool(masked.slots)


def left_unmasked(src: str, tgt: str, data: DataConfig) -> bool:
    """Whether a training pair stays unmasked: its blake2b hash, keyed with `data.seed`, falls in
    the first `data.passthrough_unmasked` of the range. Fixed by the pair and the seed alone, so
    the same pairs in any worker, on any resume, in the vocabulary sample and in the shards."""
    share = data.passthrough_unmasked
    if share <= 0.0:
        return False
    key = data.seed.to_bytes(8, "little", signed=True)
    digest = hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "little") < share * 2.0**64


def pair_prep(data: DataConfig, split: str) -> PairPrep | None:
    """The `PairPrep` of `split`, or None where its lines go to SentencePiece as they are (train
    without pass-through)."""
    raw = split != "train"
    return PairPrep(data, raw) if raw or data.passthrough else None
