"""SentencePiece's training sample: a seeded draw of the kept pairs, bounded in characters per side.

SentencePiece's memory is set by the text it loads (the unigram trainer builds a suffix array
over every loaded character), so the sample, not the corpus, must bound it. Each pair gets a
key, a 64-bit keyed hash of its two sides under `data.seed`; each side's sample is the lines of
the pairs with the smallest keys, in key order, up to `vocab.sample_chars` characters (the line
that crosses the budget is kept) and at most `vocab.max_sentences` lines.

This is a bottom-k sample: uniform over the pairs, independent of their order in the file and of
the machine (the same pairs give the same sample, byte for byte), and drawn in one streaming
pass whose memory is the sample's, whatever the corpus size.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from nmt.data.readers import count_lines
from nmt.errors import NmtError
from nmt.files import atomic_path

_PROGRESS_EVERY = 10_000  # lines between progress-bar updates
Prepare = Callable[[str, str], tuple] | None


def pair_key(src: bytes, tgt: bytes, seed: int) -> int:
    """The pair's 64-bit sampling key: blake2b of its UTF-8 lines "src\ttgt", keyed by the seed's decimal text."""
    digest = hashlib.blake2b(src + b"\t" + tgt, digest_size=8, key=str(seed).encode())
    return int.from_bytes(digest.digest(), "big")


@dataclass
class BottomK:
    """The lines of the smallest keys seen so far whose characters reach `budget` (all lines while
    they do not), at most `max_lines` of them.

    A max-heap of (-key, line): a new line is pushed, then the largest keys are dropped while
    the rest still reach the budget. Once the budget is reached, a key above the largest held
    one is refused at the cost of one comparison, which is what most of a large corpus gets.
    """

    budget: int  # characters (str length; a line's "\\n" not counted)
    max_lines: int
    chars: int = 0  # characters of the lines held
    _heap: list[tuple[int, str]] = field(default_factory=list)

    def wants(self, key: int) -> bool:
        """Whether a line of this key would be kept now (else `add` would drop it at once)."""
        heap = self._heap
        full = self.chars >= self.budget or len(heap) >= self.max_lines
        return not (full and heap and key >= -heap[0][0])

    def add(self, key: int, line: str) -> None:
        """Offer `line` (of a pair of this key): kept if it belongs to the sample so far."""
        if not self.wants(key):
            return
        heap = self._heap
        heapq.heappush(heap, (-key, line))
        self.chars += len(line)
        while len(heap) > self.max_lines or self.chars - len(heap[0][1]) >= self.budget:
            self.chars -= len(heapq.heappop(heap)[1])

    def lines(self) -> list[str]:
        """The lines held, smallest key first (ties, only possible between equal pairs, by text)."""
        return [line for _, line in sorted(self._heap, reverse=True)]


def _read_pairs(
    texts: tuple[Path, Path],
    samples: tuple[BottomK, BottomK],
    seed: int,
    prepare: Prepare,
    firsts: tuple[int | None, int | None],
) -> int:
    """Stream the two aligned files into the two samples; returns the number of pairs read.
    A side whose `firsts` entry is a number n is offered only the pairs of its first n lines.

    Lines are read as bytes, decoded and prepared only when a sample wants them: most of a large
    corpus is refused on its key alone (the key is the raw pair's).
    """
    total = count_lines(texts[0])
    pairs = 0
    with (
        open(texts[0], "rb") as fs,
        open(texts[1], "rb") as ft,
        Progress(console=Console(stderr=True), transient=True) as progress,
    ):
        task = progress.add_task(f"sample {texts[0].parent.name}/{texts[0].stem}", total=total)
        for pairs, (s, t) in enumerate(zip(fs, ft, strict=False), start=1):
            s, t = s.rstrip(b"\n"), t.rstrip(b"\n")
            key = pair_key(s, t, seed)
            wanted = [
                (first is None or pairs <= first) and sample.wants(key)
                for sample, first in zip(samples, firsts, strict=True)
            ]
            if any(wanted):
                lines = _decode(s, texts[0], pairs), _decode(t, texts[1], pairs)
                prepared = prepare(*lines)[:2] if prepare else lines
                for sample, line, wants in zip(samples, prepared, wanted, strict=True):
                    if wants:
                        sample.add(key, line)
            if pairs % _PROGRESS_EVERY == 0:
                progress.update(task, completed=pairs)
        if ft.readline() or pairs != total:
            raise NmtError(f"{texts[1]}: not as many lines as {texts[0]} ({total}); rebuild the corpus")
    return pairs


def _decode(line: bytes, path: Path, number: int) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NmtError(f"{path}:{number}: not UTF-8 ({e.reason} at byte {e.start}); rebuild the corpus") from None


def draw_vocab_sample(
    texts: tuple[Path, Path],
    outputs: tuple[Path, Path],
    budget: int,
    max_lines: int,
    seed: int,
    prepare: Prepare = None,
    firsts: tuple[int | None, int | None] = (None, None),
) -> list[dict]:
    """Write the sample of each side of the aligned files `texts` (src, tgt) to `outputs`, atomically.

    `budget`: characters per side (of the prepared lines); `max_lines`: lines per side; `seed`:
    the key's seed; `prepare(src, tgt)` → (src, tgt, ...): what a sampled pair becomes first
    (`nmt.data.passthrough.PairPrep`: pass-through masking), None: kept as read; `firsts`: per
    side, None or n to draw from the first n lines only (the real pairs of a train split that ends
    with back-translated ones: a synthetic side never shapes the vocabulary).
    Returns per side {"sentences", "chars", "of_sentences"} (lines kept, their characters, pairs read).
    """
    samples = (BottomK(budget, max_lines), BottomK(budget, max_lines))
    pairs = _read_pairs(texts, samples, seed, prepare, firsts)
    stats = []
    for sample, out in zip(samples, outputs, strict=True):
        lines = sample.lines()
        with atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)
        stats.append({"sentences": len(lines), "chars": sample.chars, "of_sentences": pairs})
    return stats
