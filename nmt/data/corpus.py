"""Corpus preparation: read a recipe's splits (hub or local mirror), clean train, write plain text.

Writes `<run>/corpus/{train,valid,test}.{src,tgt}` (one sentence per line), `test.codes` when the
mirror has a `test.codes.txt` next to the test file (or the hub recipe has a label column), and
`stats.json` (per split: read, kept,
dropped per rule; `read == kept + sum(dropped)`). All files of one call appear together or not
at all.

Train is normalised (`normalize_source`/`normalize_target`) and filtered. Valid and test are the
raw references, only whitespace-stripped (line breaks and tabs inside a sentence become spaces),
so that BLEU stays comparable with published numbers; valid drops pairs whose both sides are
empty. Sources are normalised at translation time with `normalize_source`.

Bad input lines (invalid UTF-8, invalid JSON, a record without the language keys, a TSV line
without a TAB, a blank JSONL line) are skipped, counted under `dropped["bad_line"]` and reported
in one warning per file naming the first bad line (`train.jsonl:17: invalid JSON (skipped 3 bad
lines)`). A split with nothing usable is an `NmtError`.

Length ratio (`data.max_ratio`): a Chinese side counts its non-space characters, any other side
its characters divided by `LATIN_CHARS_PER_HANZI` (= 3, the median en/zh character ratio of
Tatoeba and WMT news is 3.1-3.7), so balanced pairs score about 1 whichever side is longer;
ratio = longer / shorter, each length at least 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import random
import warnings
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from nmt.config import BT_TAG, Config, DataConfig, stamp_sections
from nmt.data.normalize import normalize_source, normalize_target, strip_text
from nmt.data.readers import (
    Source,
    count_lines,
    find_sources,
    read_split,
)
from nmt.data.recipes import SPLITS, BadLines, Recipe, get_recipe
from nmt.errors import NmtError
from nmt.files import atomic_path
from nmt.runs import clear_stamp, hash_files, is_fresh, write_stamp

TRAIN_RULES = ("bad_line", "empty", "too_long", "ratio", "overlap", "duplicate", "subsampled")
LATIN_CHARS_PER_HANZI = 3.0


def _scaled_len(text: str, chinese: bool) -> float:
    if chinese:
        return float(len(text) - text.count(" "))
    return len(text) / LATIN_CHARS_PER_HANZI


def length_ratio(src: str, tgt: str, data: DataConfig) -> float:
    a = max(_scaled_len(src, data.src_lang.startswith("zh")), 1.0)
    b = max(_scaled_len(tgt, data.tgt_lang.startswith("zh")), 1.0)
    return max(a, b) / min(a, b)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


# --------------------------------------------------------------------------- cleaning and writing


def _train_pairs(
    pairs: Iterator[tuple[int, str, str]], data: DataConfig, held: set[int], dropped: dict[str, int]
) -> Iterator[tuple[str, str]]:
    """Normalise and filter train pairs, counting each drop under its rule."""
    seen: set[int] = set()
    for _, s, t in pairs:
        s, t = normalize_source(s, data), normalize_target(t, data)
        rule = None
        if not s or not t:
            rule = "empty"
        elif len(s) > data.max_chars or len(t) > data.max_chars:
            rule = "too_long"
        elif length_ratio(s, t, data) > data.max_ratio:
            rule = "ratio"
        elif data.filter_overlap and (_hash("S" + s) in held or _hash("T" + t) in held):
            rule = "overlap"
        elif data.dedup:
            h = _hash(s + "\t" + t)
            rule = "duplicate" if h in seen else None
            seen.add(h)
        if rule:
            dropped[rule] += 1
            continue
        yield s, t


def _reservoir(items: Iterator[tuple[str, str]], k: int, seed: int) -> tuple[list[tuple[str, str]], int]:
    """A uniform sample of k items in their original order (streaming), and how many were seen."""
    rng, sample, n = random.Random(seed), [], 0
    for n, item in enumerate(items, 1):
        if len(sample) < k:
            sample.append((n, item))
        else:
            j = rng.randrange(n)
            if j < k:
                sample[j] = (n, item)
    sample.sort(key=lambda x: x[0])
    return [item for _, item in sample], n


def _write_train(source: Source, recipe: Recipe, data: DataConfig, tmp: dict[str, Path], held: set[int]) -> dict:
    bad = BadLines(source.label)
    dropped = dict.fromkeys(TRAIN_RULES, 0)
    pairs = _train_pairs(read_split(source, recipe, data, bad), data, held, dropped)
    if data.max_train_pairs is not None:
        sample, seen = _reservoir(pairs, data.max_train_pairs, data.seed)
        dropped["subsampled"] = seen - len(sample)
        pairs = iter(sample)
    kept = 0
    with (
        open(tmp[f"train.{data.src_lang}"], "w", encoding="utf-8") as fs,
        open(tmp[f"train.{data.tgt_lang}"], "w", encoding="utf-8") as ft,
    ):
        copies = data.backtranslation.real_upsample if data.backtranslation else 1
        for s, t in pairs:
            fs.write((s + "\n") * copies)  # upsampled real pairs: a real:synthetic ratio
            ft.write((t + "\n") * copies)
            kept += 1
    read = _tally(bad, dropped, kept)
    if read == bad.count:
        raise NmtError(f"{source.label}: no usable train pairs ({bad.count} bad lines)")
    if kept == 0:
        raise NmtError(f"{source.label}: no train pairs left after cleaning ({read} read, dropped {_nonzero(dropped)})")
    return {"source": source.label, "read": read, "kept": kept, "dropped": dropped}


def _tally(bad: BadLines, dropped: dict[str, int], kept: int) -> int:
    """Warn about the bad lines, count them under `bad_line`; the lines read (kept + dropped)."""
    bad.warn()
    dropped["bad_line"] = bad.count
    return kept + sum(dropped.values())


def _write_synthetic(recipe: Recipe, data: DataConfig, tmp: dict[str, Path], held: set[int]) -> dict:
    """Append the back-translated pairs of `data.backtranslation.corpus` to train, cleaned like real
    ones (the same rules, the overlap guard included), tagged with BT_TAG when `tag`."""
    bt = data.backtranslation
    path = Path(bt.corpus) / "train.jsonl"
    if not path.is_file():
        raise NmtError(f"data.backtranslation.corpus: {path} not found (write it with `nmt backtranslate`)")
    bad, dropped = BadLines(str(path)), dict.fromkeys(TRAIN_RULES, 0)
    pairs = _train_pairs(read_split(Source("jsonl", (path,), str(path)), recipe, data, bad), data, held, dropped)
    kept, tag = 0, f"{BT_TAG} " if bt.tag else ""
    with (
        open(tmp[f"train.{data.src_lang}"], "a", encoding="utf-8") as fs,
        open(tmp[f"train.{data.tgt_lang}"], "a", encoding="utf-8") as ft,
    ):
        for s, t in itertools.islice(pairs, bt.max_pairs):
            fs.write(f"{tag}{s}\n")
            ft.write(t + "\n")
            kept += 1
    read = _tally(bad, dropped, kept)
    return {"source": str(path), "read": read, "kept": kept, "dropped": dropped, "tag": bt.tag}


def _write_eval(
    source: Source, recipe: Recipe, data: DataConfig, split: str, tmp: dict[str, Path], held: set[int]
) -> tuple[dict, BadLines, list[str]]:
    """Raw references: whitespace-stripped only. Valid drops pairs with both sides empty.

    Returns the stats, the skipped lines and the hub labels of the kept pairs (empty for files)."""
    bad, labels = BadLines(source.label, keep_lines=True), []
    read = kept = 0
    with (
        open(tmp[f"{split}.{data.src_lang}"], "w", encoding="utf-8") as fs,
        open(tmp[f"{split}.{data.tgt_lang}"], "w", encoding="utf-8") as ft,
    ):
        for _, s, t in read_split(source, recipe, data, bad, labels):
            read += 1
            s, t = strip_text(s), strip_text(t)
            if split == "valid" and not s and not t:
                continue
            fs.write(s + "\n")
            ft.write(t + "\n")
            kept += 1
            held.update((_hash("S" + normalize_source(s, data)), _hash("T" + normalize_target(t, data))))
    bad.warn()
    if kept == 0 and source.kind != "none":
        raise NmtError(f"{source.label}: no usable {split} pairs ({bad.count} bad lines)")
    dropped = {"bad_line": bad.count} | ({"empty": read - kept} if split == "valid" else {})
    return {"source": source.label, "read": read + bad.count, "kept": kept, "dropped": dropped}, bad, labels


def _write_codes(test: Source, bad: BadLines, read: int, tmp: Path, labels: list[str]) -> None:
    """The test codes: the hub's label column, or test.codes.txt without the lines skipped in the test file."""
    if test.kind == "hub":
        tmp.write_text("".join(code + "\n" for code in labels), encoding="utf-8")
        return
    codes = test.paths[0].parent / "test.codes.txt"
    n = count_lines(codes)
    if n != read:
        raise NmtError(f"{codes} has {n} lines but {test.label} has {read}: codes must align with the test set")
    with open(codes, encoding="utf-8-sig") as f, open(tmp, "w", encoding="utf-8") as out:
        out.writelines(line.rstrip("\r\n") + "\n" for i, line in enumerate(f, 1) if i not in bad.lines)


def _codes_source(sources: dict[str, Source], recipe: Recipe) -> bool:
    test = sources["test"]
    if test.kind == "hub":
        return bool(recipe.label)
    return test.kind in ("jsonl", "tsv", "plain") and (test.paths[0].parent / "test.codes.txt").is_file()


def _output_names(data: DataConfig, codes: bool) -> list[str]:
    names = [f"{s}.{lang}" for s in SPLITS for lang in (data.src_lang, data.tgt_lang)] + ["stats.json"]
    return names + ["test.codes"] if codes else names


def _write_corpus(sources: dict[str, Source], recipe: Recipe, data: DataConfig, out: Path) -> dict:
    codes = _codes_source(sources, recipe)
    stats: dict = {"corpus": recipe.name}
    with contextlib.ExitStack() as stack:  # every file renamed into place only if all succeed
        tmp = {name: stack.enter_context(atomic_path(out / name)) for name in _output_names(data, codes)}
        held: set[int] = set()
        stats["valid"], _, _ = _write_eval(sources["valid"], recipe, data, "valid", tmp, held)
        stats["test"], bad, labels = _write_eval(sources["test"], recipe, data, "test", tmp, held)
        if sources["test"].kind == "none":
            warnings.warn(f"corpus {recipe.name!r} has no test split; {out}/test.* are empty", stacklevel=2)
        if codes:
            _write_codes(sources["test"], bad, stats["test"]["read"], tmp["test.codes"], labels)
        stats["train"] = _write_train(sources["train"], recipe, data, tmp, held if data.filter_overlap else set())
        if data.backtranslation is not None:
            stats["backtranslation"] = _write_synthetic(recipe, data, tmp, held if data.filter_overlap else set())
        tmp["stats.json"].write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if not codes:
        with contextlib.suppress(FileNotFoundError):
            (out / "test.codes").unlink()
    return stats


def _nonzero(dropped: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in dropped.items() if v) or "nothing"


def print_stats(stats: dict, console: Console | None = None) -> None:
    table = Table(title=f"corpus {stats.get('corpus', '')}")
    table.add_column("")
    for split in SPLITS:
        table.add_column(split, justify="right")
    for row in ("read", "kept"):
        table.add_row(row, *(str(stats[split][row]) for split in SPLITS))
    for rule in TRAIN_RULES:
        table.add_row(f"- {rule}", *(str(stats[split]["dropped"].get(rule, "")) for split in SPLITS))
    (console or Console(stderr=True)).print(table)


def prepare_corpus(config: Config, run_dir: Path, mirror: str | None = None) -> dict:
    """Read, clean and write the corpus of `config.data.corpus` into `<run>/corpus`; return the stats.

    Skipped (stats read back) when the "download" stamp matches the input files and data config.
    """
    data, run_dir = config.data, Path(run_dir)
    recipe = get_recipe(data.corpus)
    sources = find_sources(recipe, data, mirror)
    out = run_dir / "corpus"
    files = [p for s in sources.values() for p in s.paths]
    if data.backtranslation is not None and (Path(data.backtranslation.corpus) / "train.jsonl").is_file():
        files.append(Path(data.backtranslation.corpus) / "train.jsonl")
    if _codes_source(sources, recipe) and sources["test"].kind != "hub":
        files.append(sources["test"].paths[0].parent / "test.codes.txt")
    settings = {k: v for k, v in stamp_sections(config)["data"].items() if k != "mirror"}
    digest = hash_files(
        files,
        extra={"data": settings, "recipe": dataclasses.asdict(recipe), "kinds": [s.kind for s in sources.values()]},
    )
    names = _output_names(data, _codes_source(sources, recipe))
    if is_fresh(run_dir, "download", digest) and all((out / n).is_file() for n in names):
        Console(stderr=True).print(f"corpus: {out} is up to date (skipped)")
        return json.loads((out / "stats.json").read_text(encoding="utf-8"))
    clear_stamp(run_dir, "download")
    stats = _write_corpus(sources, recipe, data, out)
    print_stats(stats)
    write_stamp(run_dir, "download", digest, {"corpus": recipe.name})
    return stats
