"""Corpus preparation: read a recipe's splits (hub or local mirror), clean train, write plain text.

Writes `<run>/corpus/{train,valid,test}.{src,tgt}` (one sentence per line), `test.codes` when the
mirror has a `test.codes.txt` next to the test file (or the hub recipe has a label column),
`stats.json` (per split: read, kept, dropped per rule; `read == kept + sum(dropped)`; train also
its bad lines by reason with the first line number) and `manifest.json` (sha256 and line count
of every file). All files of one call appear together or not at all.

Train is the train split of `data.corpus`, or the corpora of `data.corpora`, each written
`weight` times (`nmt.data.corpora`; stats.json then counts each under `train.corpora`). It is
cleaned on `data.workers` processes (`nmt.data.clean`: normalised with
`normalize_source`/`normalize_target` and filtered, unit by unit), then duplicates are dropped,
first occurrence kept, across corpora (`nmt.data.dedup`), then `data.max_train_pairs` keeps
exactly that many, seeded (`nmt.data.subset`); the units are concatenated in order, so the
output is the same for any number of workers. A hub split is downloaded once into the hub cache
and read from its Parquet row groups (`nmt.data.hub_cache`). Valid and test come from
`data.corpus`, or from the files `data.valid` / `data.test` name. The work folder
`<run>/corpus.work/` lets a killed run continue at the first unfinished unit; it is removed
when the corpus is written. Valid and test are the raw
references, only whitespace-stripped (line breaks and tabs inside a sentence become spaces), so
that BLEU stays comparable with published numbers; valid drops pairs whose both sides are empty.
Sources are normalised at translation time with `normalize_source`.

Bad input lines (`nmt.data.readers`: invalid UTF-8, a NUL byte, a line over 1 MiB, invalid JSON,
a record without the language keys, a TSV line without a TAB, a blank JSONL line) are skipped,
counted under `dropped["bad_line"]` and reported in one warning per file naming the first bad
line (`train.jsonl:17: invalid JSON (skipped 3 bad lines)`, then each reason's count and first
line when there are several). A split with nothing usable is an `NmtError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import shutil
from pathlib import Path
from typing import TextIO

import numpy as np
from rich.console import Console
from rich.table import Table

from nmt.config import BT_TAG, Config, DataConfig, eval_set_name, stamp_sections
from nmt.data.clean import Cleaned, Held, clean_units, unit_path
from nmt.data.corpora import TrainCorpus, clean_corpora, pair_copies, per_corpus, train_corpora, written_pairs
from nmt.data.dedup import first_occurrences
from nmt.data.normalize import normalize_source, normalize_target, strip_text
from nmt.data.readers import Source, cached_hub, check_aligned, count_lines, find_sources, path_source, read_split
from nmt.data.recipes import SPLITS, BadLines, Recipe, get_recipe
from nmt.data.subset import keep_subset
from nmt.data.synthetic_filter import cap_synthetic, filter_synthetic
from nmt.errors import NmtError, warn
from nmt.files import atomic_path
from nmt.run.dirs import checkpoint_run
from nmt.run.layout import RunDir
from nmt.run.stamps import clear_stamp, hash_files, stage_is_done, write_stamp

TRAIN_RULES = (
    "bad_line",
    "empty",
    "too_long",
    "markup",
    "ratio",
    "identical",
    "script",
    "overlap",
    "duplicate",
    "near_duplicate",
    "subsampled",
)


# --------------------------------------------------------------------------- cleaning and writing


@dataclasses.dataclass(frozen=True)
class _Work:
    """Where a split's units are cleaned, and the digest of the inputs and settings they belong to."""

    folder: Path
    digest: str

    def split(self, name: str) -> _Work:
        return _Work(self.folder / name, self.digest)


def _clean(source: Source, recipe: Recipe, data: DataConfig, held: Held, work: _Work) -> tuple[Cleaned, list]:
    """The split cleaned unit by unit into `work`, and per unit the mask of its pairs that are
    not repeats of an earlier pair (all True without `data.dedup`)."""
    cleaned = clean_units(source, recipe, data, held, work.folder, work.digest)
    keys = [unit_path(work.folder, i, ".keys.npy") for i in range(len(cleaned.counts))]
    masks = first_occurrences(keys, work.folder) if data.dedup else [np.ones(n, dtype=bool) for n in cleaned.kept]
    return cleaned, masks


def _write_units(cleaned: Cleaned, masks: list, fs: TextIO, ft: TextIO, copies: int | list = 1, tag: str = "") -> int:
    """The pairs of every unit whose mask is True, in unit order, each `copies` times (or
    `copies[unit][pair]` times: `nmt.data.corpora.pair_copies`), source prefixed with `tag`;
    how many distinct pairs were written."""
    written = 0
    for i, mask in enumerate(masks):
        with (
            open(unit_path(cleaned.folder, i, ".src"), encoding="utf-8") as a,
            open(unit_path(cleaned.folder, i, ".tgt"), encoding="utf-8") as b,
        ):
            if copies == 1 and not tag and mask.all():
                shutil.copyfileobj(a, fs)
                shutil.copyfileobj(b, ft)
            else:
                times = itertools.repeat(copies) if isinstance(copies, int) else copies[i].tolist()
                for keep, n, s, t in zip(mask.tolist(), times, a, b, strict=False):
                    if keep:
                        fs.write((tag + s) * n)
                        ft.write(t * n)
        written += int(mask.sum())
    return written


def _write_train(corpora: list[TrainCorpus], data: DataConfig, tmp: dict[str, Path], held: Held, work: _Work) -> dict:
    """The training pairs of every corpus, cleaned, deduplicated across corpora, sampled and
    written with their weights; the split's stats (with one entry per corpus under `corpora`
    when `data.corpora` names them)."""
    folders = [work.folder / ("train" if i == 0 else f"train.{i}") for i in range(len(corpora))]
    cleaned, found = clean_corpora(corpora, data, held, folders, work.digest)
    unique = found.masks
    flat, sizes = [m for ms in unique for m in ms], [len(ms) for ms in unique]
    chosen = flat if data.max_train_pairs is None else keep_subset(flat, data.max_train_pairs, data.seed)[0]
    masks = per_corpus(chosen, sizes)
    real = data.backtranslation.real_upsample if data.backtranslation else 1  # a real:synthetic ratio
    stats = []
    with (
        open(tmp[f"train.{data.src_lang}"], "w", encoding="utf-8") as fs,
        open(tmp[f"train.{data.tgt_lang}"], "w", encoding="utf-8") as ft,
    ):
        for corpus, c, u, m, near in zip(corpora, cleaned, unique, masks, found.near, strict=True):
            duplicate = sum(len(x) - int(x.sum()) for x in u) - near
            dropped = {"bad_line": 0, **c.dropped(), "duplicate": duplicate, "near_duplicate": near}
            dropped["subsampled"] = _count(u) - _count(m)
            copies = pair_copies(c, corpus.weight * real, data.seed)
            kept = _write_units(c, m, fs, ft, copies)
            read = _tally(c.bad, dropped, kept)
            if read == c.bad.count:
                raise NmtError(f"{corpus.source.label}: no usable train pairs ({c.bad.count} bad lines)")
            entry = {"source": corpus.source.label, "read": read, "kept": kept, "dropped": dropped}
            stats.append(entry | {"bad_lines": c.bad.summary()})
            if data.corpora:
                written = written_pairs(copies, m)
                stats[-1] |= {"corpus": corpus.name, "weight": corpus.weight, "pairs": written}
    total = stats[0] if len(stats) == 1 and not data.corpora else _totals(stats)
    if total["kept"] == 0:
        dropped = _nonzero(total["dropped"])
        raise NmtError(
            f"{total['source']}: no train pairs left after cleaning ({total['read']} read, dropped {dropped})"
        )
    return total


def _count(masks: list) -> int:
    return sum(int(m.sum()) for m in masks)


def _totals(corpora: list[dict]) -> dict:
    """The train split's stats summed over its corpora, each corpus's own under `corpora`."""
    dropped = {rule: sum(c["dropped"][rule] for c in corpora) for rule in corpora[0]["dropped"]}
    return {
        "source": " + ".join(c["source"] for c in corpora),
        "read": sum(c["read"] for c in corpora),
        "kept": sum(c["kept"] for c in corpora),
        "dropped": dropped,
        "pairs": sum(c["pairs"] for c in corpora),
        "corpora": corpora,
    }


def _tally(bad: BadLines, dropped: dict[str, int], kept: int) -> int:
    """Warn about the bad lines, count them under `bad_line`; the lines read (kept + dropped)."""
    bad.warn()
    dropped["bad_line"] = bad.count
    return kept + sum(dropped.values())


def _first(masks: list, k: int | None) -> list:
    """The masks with only their first k True values (in unit order) left True."""
    if k is None:
        return masks
    out = []
    for m in masks:
        m = m.copy()
        m[np.flatnonzero(m)[k:]] = False
        k = max(0, k - int(m.sum()))
        out.append(m)
    return out


def _write_synthetic(
    recipe: Recipe, data: DataConfig, tmp: dict[str, Path], held: Held, work: _Work, real_lines: int
) -> dict:
    """Append the back-translated pairs of `data.backtranslation.corpus` to train, cleaned like real
    ones (the same rules, the overlap guard included), then through the synthetic-only rules
    (`nmt.data.synthetic_filter`), the first `max_pairs` of them, at most `ratio` × `real_lines`
    (the real lines train holds) drawn seeded, tagged with BT_TAG when `tag`."""
    bt = data.backtranslation
    path = Path(bt.corpus) / "train.jsonl"
    if not path.is_file():
        raise NmtError(f"data.backtranslation.corpus: {path} not found (write it with `nmt backtranslate`)")
    cleaned, unique = _clean(Source("jsonl", (path,), str(path)), recipe, data, held, work)
    dropped = {"bad_line": 0, **cleaned.dropped(), "duplicate": sum(len(m) - int(m.sum()) for m in unique)}
    unique, synthetic = filter_synthetic(cleaned, unique, data)
    masks = _first(unique, bt.max_pairs)
    dropped |= synthetic | {"subsampled": sum(int(m.sum()) for m in unique) - sum(int(m.sum()) for m in masks)}
    masks, dropped["real_ratio"] = cap_synthetic(masks, real_lines, data)
    with (
        open(tmp[f"train.{data.src_lang}"], "a", encoding="utf-8") as fs,
        open(tmp[f"train.{data.tgt_lang}"], "a", encoding="utf-8") as ft,
    ):
        kept = _write_units(cleaned, masks, fs, ft, tag=f"{BT_TAG} " if bt.tag else "")
    read = _tally(cleaned.bad, dropped, kept)
    return {"source": str(path), "read": read, "kept": kept, "dropped": dropped, "tag": bt.tag}


def _write_eval(
    source: Source, recipe: Recipe, data: DataConfig, split: str, tmp: dict[str, Path], held: tuple[set, set]
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
            held[0].add(normalize_source(s, data))
            held[1].add(normalize_target(t, data))
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
    sets = [*SPLITS, *(eval_set_name(e) for e in data.eval_sets)]
    names = [f"{s}.{lang}" for s in sets for lang in (data.src_lang, data.tgt_lang)]
    names += ["stats.json", "manifest.json", "DATA.md"]
    return names + ["test.codes"] if codes else names


def eval_set_sources(data: DataConfig, mirror: str | None) -> dict[str, tuple[Source, Recipe]]:
    """Each `data.eval_sets` entry's source (found before any work: a missing one stops the run)
    and the recipe its records read with, by report name."""
    out = {}
    for i, entry in enumerate(data.eval_sets):
        key = f"data.eval_sets[{i}]"
        if entry.corpus:
            recipe = get_recipe(entry.corpus, f"{key}.corpus")
            where = find_sources(recipe, data, mirror, need=(), key=f"{key}.corpus", own_folder=True)
            source = where[entry.split]
            if source.kind == "none":
                raise NmtError(f"{key}: corpus {entry.corpus!r} has no {entry.split} split ({source.label} not found)")
        else:
            recipe, source = get_recipe(data.corpus), path_source(entry.path, data, entry.split, f"{key}.path")
        out[eval_set_name(entry)] = (source, recipe)
    return out


def _write_corpus(
    sources: dict[str, Source],
    corpora: list[TrainCorpus],
    recipe: Recipe,
    data: DataConfig,
    out: Path,
    work: _Work,
    extra: dict[str, tuple[Source, Recipe]],
    inherited: dict | None = None,
) -> dict:
    """Every output file of the corpus (`sources`: valid and test; `corpora`: the training
    corpora; `extra`: the more test sets of `data.eval_sets`, by name; `inherited`: the
    provenance of `train.init_from`'s run, whose data the weights have seen)."""
    codes = _codes_source(sources, recipe)
    stats: dict = {"corpus": recipe.name}
    for name in _output_names(data, True):  # temporary files of a run that was killed
        for stale in out.glob(f".{name}.*.tmp"):
            stale.unlink()
    with contextlib.ExitStack() as stack:  # every file renamed into place only if all succeed
        tmp = {name: stack.enter_context(atomic_path(out / name)) for name in _output_names(data, codes)}
        held: tuple[set, set] = (set(), set())
        stats["valid"], _, _ = _write_eval(sources["valid"], recipe, data, "valid", tmp, held)
        stats["test"], bad, labels = _write_eval(sources["test"], recipe, data, "test", tmp, held)
        if sources["test"].kind == "none":
            warn(f"corpus {recipe.name!r} has no test split; {out}/test.* are empty")
        if codes:
            _write_codes(sources["test"], bad, stats["test"]["read"], tmp["test.codes"], labels)
        if extra:
            stats["eval_sets"] = {
                name: _write_eval(source, own, data, name, tmp, held)[0] for name, (source, own) in extra.items()
            }
        guard = Held(frozenset(held[0]), frozenset(held[1])) if data.filter_overlap else Held()
        stats["train"] = _write_train(corpora, data, tmp, guard, work)
        if data.backtranslation is not None:
            written = stats["train"].get("pairs")  # data.corpora: with their weights (and real_upsample)
            real = written if written is not None else stats["train"]["kept"] * data.backtranslation.real_upsample
            stats["backtranslation"] = _write_synthetic(recipe, data, tmp, guard, work.split("backtranslation"), real)
        stats["provenance"] = provenance(corpora, inherited)
        tmp["DATA.md"].write_text(data_card(stats["provenance"]), encoding="utf-8")
        tmp["stats.json"].write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        _write_manifest(tmp, stats)
    if not codes:
        with contextlib.suppress(FileNotFoundError):
            (out / "test.codes").unlink()
    return stats


def provenance(corpora: list[TrainCorpus], inherited: dict | None = None) -> dict:
    """What the training data is and may be used for: per corpus its source and licence, and
    whether any allows research use only (`Recipe.research_only`), for DATA.md and exports.
    `inherited`: the provenance of the run a fine-tuning run starts from (`train.init_from`); its
    corpora are listed too, marked `"via": "train.init_from"`, since the weights learnt from them."""
    entries = [{**e, "via": "train.init_from"} for e in (inherited or {}).get("corpora", [])]
    for c in corpora:
        named = c.name == c.recipe.name  # a recipe; else a local path read with the main recipe's rules
        entries.append(
            {
                "corpus": c.name,
                "source": c.source.label,
                "licence": c.recipe.licence if named else "a local file: its own licence applies",
                "research_only": c.recipe.research_only if named else False,
            }
        )
    return {"corpora": entries, "research_only": any(e["research_only"] for e in entries)}


def data_card(prov: dict) -> str:
    """DATA.md: the training corpora and their licences, with a warning first when any is research-only."""
    lines = ["# Training data", ""]
    if prov["research_only"]:
        lines += [
            "**Research and benchmarking only.** This model was trained on corpora whose licence is unclear",
            "or non-commercial (marked below); the model inherits their terms. Do not ship it in a product.",
            "",
        ]
    lines += ["| corpus | source | licence |", "|---|---|---|"]
    lines += [
        f"| {e['corpus']}{' (the weights it started from: train.init_from)' if e.get('via') else ''} "
        f"| `{e['source']}` | {e['licence']}{' (research only)' if e['research_only'] else ''} |"
        for e in prov["corpora"]
    ]
    return "\n".join(lines) + "\n"


def inherited_provenance(config: Config) -> dict | None:
    """The provenance recorded by `train.init_from`'s run (its corpus/stats.json), or None when
    the run starts from scratch. A source run without the record counts as an unknown corpus, so
    a fine-tuned model never looks cleaner than what it was trained on."""
    if not config.train.init_from:
        return None
    source = checkpoint_run(Path(config.train.init_from))
    try:
        found = json.loads(RunDir(source).corpus_stats.read_text(encoding="utf-8")).get("provenance")
    except (OSError, json.JSONDecodeError):
        found = None
    if isinstance(found, dict) and "corpora" in found:
        return found
    unknown = {"corpus": f"the training data of {source}", "source": str(source), "licence": "not recorded"}
    return {"corpora": [unknown | {"research_only": False}], "research_only": False}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_manifest(tmp: dict[str, Path], stats: dict) -> None:
    """manifest.json: sha256 and line count of every other output file, and the pairs kept per split."""
    files = {
        name: {"sha256": _sha256(p), "lines": count_lines(p)} for name, p in tmp.items() if name != "manifest.json"
    }
    kept = {split: stats[split]["kept"] for split in (*SPLITS, "backtranslation") if split in stats}
    text = json.dumps({"files": files, "kept": kept}, indent=2, sort_keys=True) + "\n"
    tmp["manifest.json"].write_text(text, encoding="utf-8")


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
    console = console or Console(stderr=True)
    console.print(table)
    if "corpora" in stats["train"]:
        console.print(_corpora_table(stats["train"]["corpora"]))
    bt = stats.get("backtranslation")
    if bt:  # the synthetic pairs: kept, and dropped by reason (the synthetic-only rules included)
        console.print(f"back-translation: {bt['read']} read, {bt['kept']} kept; dropped {_nonzero(bt['dropped'])}")


def _corpora_table(corpora: list[dict]) -> Table:
    """The training corpora of `data.corpora`: pairs read and kept, the weight, the pairs written."""
    table = Table(title="training corpora")
    for column in ("corpus", "read", "kept", "- duplicate", "weight", "pairs"):
        table.add_column(column, justify="left" if column == "corpus" else "right")
    for c in corpora:
        row = (c["read"], c["kept"], c["dropped"]["duplicate"], c["weight"], c["pairs"])
        table.add_row(c["corpus"], *map(str, row))
    return table


def prepare_corpus(config: Config, run_dir: Path, mirror: str | None = None) -> dict:
    """Read, clean and write the corpus of `config.data.corpus` into `<run>/corpus`; return the stats.

    Skipped (stats read back) when the "download" stamp matches the input files and data config.
    """
    data, run_dir = config.data, Path(run_dir)
    recipe = get_recipe(data.corpus)
    found = find_sources(recipe, data, mirror, need=("valid",) if data.corpora else ("train", "valid"))
    extra = eval_set_sources(data, mirror)
    corpora = train_corpora(recipe, found["train"], data, mirror)
    sources = {split: cached_hub(found[split], recipe) for split in ("valid", "test")}
    extra = {name: (cached_hub(source, own), own) for name, (source, own) in extra.items()}
    inputs = [*(c.source for c in corpora), sources["valid"], sources["test"], *(s for s, _ in extra.values())]
    for source in inputs:  # differing plain files stop before any work
        if source.kind == "plain":
            check_aligned(*source.paths)
    run = RunDir(run_dir)
    out = run.corpus
    files = [p for s in inputs if s.kind != "hub" for p in s.paths]  # hub files: named by their commit
    if data.backtranslation is not None and (Path(data.backtranslation.corpus) / "train.jsonl").is_file():
        files.append(Path(data.backtranslation.corpus) / "train.jsonl")
    if _codes_source(sources, recipe) and sources["test"].kind != "hub":
        files.append(sources["test"].paths[0].parent / "test.codes.txt")
    settings = {k: v for k, v in stamp_sections(config)["data"].items() if k != "mirror"}
    inherited = inherited_provenance(config)
    digest = hash_files(
        files,
        extra={"data": settings, "recipe": dataclasses.asdict(recipe), "kinds": [s.kind for s in inputs]}
        | ({"hub": [s.ref for s in inputs]} if any(s.ref for s in inputs) else {})
        | ({"inherited": inherited} if inherited else {}),
    )
    names = _output_names(data, _codes_source(sources, recipe))
    if stage_is_done(run_dir, "download", digest) and all((out / n).is_file() for n in names):
        Console(stderr=True).print(f"corpus: {out} is up to date (skipped)")
        return json.loads(run.corpus_stats.read_text(encoding="utf-8"))
    clear_stamp(run_dir, "download")
    work = run.corpus_work
    stats = _write_corpus(sources, corpora, recipe, data, out, _Work(work, digest), extra, inherited)
    shutil.rmtree(work, ignore_errors=True)
    print_stats(stats)
    write_stamp(run_dir, "download", digest, {"corpus": recipe.name})
    return stats
