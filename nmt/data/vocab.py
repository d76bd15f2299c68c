"""Two SentencePiece models (source, target) with shared special ids, and the encoded splits.

`build_vocab` trains `<run>/vocab/{zh,en}.model` (named by data.src_lang / data.tgt_lang) on a
sample of the cleaned train text, then encodes every split into `<run>/bin` (valid/test sources
and references pass through `normalize_source` / `normalize_target` first, as train did).
SentencePiece's own normalisation is off ("identity"): `nmt.data.normalize.normalize_*` is the one
place text is normalised.

Pass-through (`data.passthrough`, nmt/data/passthrough.py): the placeholders `⦅0⦆…` are
user-defined symbols of both models, and spans found on both sides of a pair are masked as
the pair is drawn into SentencePiece's sample and as the encoding workers encode it
(`passthrough.PairPrep`; no masked copy of the corpus is written, and `corpus/` stays raw, so
references are untouched).

Deterministic and bounded: the sample (`<run>/vocab/sample.{zh,en}`, nmt/data/vocab_sample.py) is
drawn by nmt, seeded and capped by `vocab.sample_chars` characters per side, so SentencePiece's
memory is set by that budget, not by the corpus. SentencePiece reads it from an iterator and
returns the model in memory, so the settings it stores in the model hold no path; it runs with
SPM_THREADS threads per side, the two sides at once in two processes when `vocab.workers` >= 2.
The `.model` bytes depend only on the sample's pairs, the config and SPM_THREADS: not on the run
directory, the worker count or the order of the pairs. Files are written atomically; a rerun
after a kill removes the half-written ones and ends with the same bytes.

`vocab.ascii_pieces` makes every printable ASCII character a piece of both models, however rare
in the sample (SentencePiece's `required_chars`), so that a raw Latin name, number or URL is read
and written letter by letter on both sides rather than partly as bytes or `<unk>`;
`vocab.accented_pieces` does the same for the accented letters of `nmt.config.ACCENTED_LETTERS`.

The stage stamp covers the corpus files, the vocab and data sections, so a changed corpus or
vocabulary redoes both the models and the encoding.

A vocabulary too small for the characters a coverage requires: with byte fallback only the most
frequent characters that fit are kept in SentencePiece's training text (rarer ones become byte
pieces, still no `<unk>`); without it this is an `NmtError` naming the size key. A size larger
than the corpus supports is trained with `hard_vocab_limit=False` (a smaller model, reported).
"""

from __future__ import annotations

import collections
import concurrent.futures
import io
import json
import multiprocessing
import shutil
import string
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import sentencepiece as spm
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from nmt import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt.config import ACCENTED_LETTERS, BT_TAG, Config, VocabConfig, stamp_sections
from nmt.data.encoded import SHARD_PAIRS, TextSide, encode_split
from nmt.data.passthrough import PLACEHOLDERS, pair_prep
from nmt.data.readers import count_lines
from nmt.data.recipes import SPLITS
from nmt.data.tokenizer import Tokenizer
from nmt.data.vocab_sample import draw_vocab_sample
from nmt.errors import NmtError, warn
from nmt.files import atomic_path
from nmt.run.dirs import checkpoint_run
from nmt.run.layout import RunDir
from nmt.run.stamps import clear_stamp, hash_files, stage_is_done, write_stamp

_META_PIECES = 4  # pad, unk, bos, eos
_BYTE_PIECES = 256
ASCII_CHARS = string.ascii_letters + string.digits + string.punctuation  # vocab.ascii_pieces: 94 pieces
ACCENTED_CHARS = "".join(dict.fromkeys(ACCENTED_LETTERS + ACCENTED_LETTERS.upper()))  # vocab.accented_pieces


def required_chars(v: VocabConfig) -> str:
    """The characters `v` makes pieces of both models whatever their frequency (ascii_pieces,
    accented_pieces); "" for neither."""
    return (ASCII_CHARS if v.ascii_pieces else "") + (ACCENTED_CHARS if v.accented_pieces else "")


# --------------------------------------------------------------------------- training

SPM_THREADS = 1  # SentencePiece threads per side: fixed, since another count can change the pieces;
# the two sides train in parallel processes instead (vocab.workers >= 2)


def _char_counts(path: Path) -> collections.Counter:
    """Character frequencies as SentencePiece sees them (a space or line start is one '▁')."""
    counts: collections.Counter = collections.Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            counts.update(line.rstrip("\n").replace(" ", "▁"))
            counts["▁"] += 1
    return counts


def _fit_chars(
    sample: Path, text: Path, size: int, coverage: float, byte_fallback: bool, key: str, symbols: int = 0
) -> set[str] | None:
    """None when the characters `coverage` requires in `sample` fit in `size`; else the most
    frequent ones that do. `text` (the corpus file the sample was drawn from) names errors;
    `symbols`: pieces reserved besides the meta and byte pieces (placeholders, required characters).

    SentencePiece refuses a coverage below 0.98, so with byte fallback the rarer characters are
    instead left out of its training text (they encode as byte pieces).
    """
    counts = _char_counts(sample)
    freqs = sorted(counts.values(), reverse=True)
    total, reserved = sum(freqs), _META_PIECES + symbols + (_BYTE_PIECES if byte_fallback else 0)
    cumulative, needed = 0, 0
    for f in freqs:  # SentencePiece adds characters until the covered share reaches `coverage`
        if total and cumulative / total >= coverage:
            break
        cumulative += f
        needed += 1
    room = size - reserved
    if needed <= room:
        return None
    if not byte_fallback or room < 16:
        raise NmtError(
            f"vocab.{key}={size} is too small for {text}: coverage {coverage} needs {needed} characters plus "
            f"{reserved} special/byte pieces; use vocab.{key} >= {needed + reserved}"
        )
    keep = room - max(1, room // 10)  # leave room for a few multi-character pieces
    allowed = {c for c, _ in counts.most_common(keep)} | {"▁"}
    share = sum(counts[c] for c in allowed) / total
    warnings.warn(
        f"vocab.{key}={size}: {keep} of {needed} characters fit ({share:.1%} of text); rest use bytes", stacklevel=3
    )
    return allowed


def _sentences(sample: Path, allowed: set[str] | None) -> Iterator[str]:
    """The sample's lines as SentencePiece trains on them: with `allowed`, other characters dropped."""
    with open(sample, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            yield "".join(c for c in line if c == " " or c in allowed) if allowed else line


def _spm_options(v: VocabConfig, size: int, coverage: float, byte_fallback: bool, symbols: list[str]) -> dict:
    """SentencePiece's settings. No path among them (the text comes from an iterator, the model
    goes to memory), so the model, which stores them, holds none; the whole sample is used."""
    required = required_chars(v)
    opts = ({"required_chars": required} if required else {}) | {
        "model_type": v.type,
        "vocab_size": size,
        "character_coverage": coverage,
        "byte_fallback": byte_fallback,
        "split_digits": v.split_digits,
        "pad_id": PAD_ID,
        "unk_id": UNK_ID,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "input_sentence_size": 0,  # the sample is drawn by nmt (nmt.data.vocab_sample)
        "shuffle_input_sentence": False,
        "normalization_rule_name": "identity",
        "num_threads": SPM_THREADS,
        "minloglevel": 2,
    }
    return opts | ({"user_defined_symbols": symbols} if symbols else {})


def _spm_train(opts: dict, sample: Path, allowed: set[str] | None) -> bytes:
    """The serialised model SentencePiece trains with `opts` on the sample (see `_sentences`)."""
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(**opts, sentence_iterator=_sentences(sample, allowed), model_writer=writer)
    return writer.getvalue()


def _train_bytes(opts: dict, sample: Path, allowed: set[str] | None, text: Path, key: str) -> bytes:
    """`_spm_train`, retried with `hard_vocab_limit=False` for a size larger than the text supports;
    any other failure is an NmtError naming the size key and `text`."""
    try:
        try:
            return _spm_train(opts, sample, allowed)
        except RuntimeError as e:
            if "Vocabulary size too high" not in str(e):
                raise
            return _spm_train(opts | {"hard_vocab_limit": False}, sample, allowed)
    except RuntimeError as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise NmtError(f"vocab.{key}={opts['vocab_size']}: SentencePiece failed on {text}: {message}") from None


def _write_model(proto: bytes, model: Path) -> int:
    """`model` and its `.vocab` (piece, score per line, as SentencePiece writes it), atomically;
    returns the number of pieces."""
    sp = spm.SentencePieceProcessor(model_proto=proto)
    pieces = sp.get_piece_size()
    with atomic_path(model.with_suffix(".vocab")) as tmp:
        tmp.write_text("".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(pieces)), encoding="utf-8")
    with atomic_path(model) as tmp:
        tmp.write_bytes(proto)
    return pieces


def train_model(config: Config, sample: Path, model: Path, side: str, text: Path | None = None) -> dict:
    """Train one SentencePiece model (side "src" or "tgt") on `sample` into `model` (+ .vocab), atomically.

    `text`: the corpus file the sample was drawn from, named in errors and warnings (default: `sample`).
    The model's bytes depend only on the sample, the config and SPM_THREADS.
    """
    v, key, text = config.vocab, f"{side}_size", text or sample
    size, coverage = (v.src_size, v.src_coverage) if side == "src" else (v.tgt_size, v.tgt_coverage)
    chinese = (config.data.src_lang if side == "src" else config.data.tgt_lang) == "zh"
    coverage = coverage if coverage is not None else (0.9995 if chinese else 1.0)  # by language
    byte_fallback = v.byte_fallback if chinese else v.byte_fallback_en  # rare characters as bytes: no <unk>
    symbols = list(PLACEHOLDERS) if config.data.passthrough else []  # pass-through placeholders, never split
    bt = config.data.backtranslation
    if side == "src" and bt is not None and bt.tag:
        symbols.append(BT_TAG)  # one piece of the source vocabulary, which the target never has
    required = required_chars(v)  # pieces whatever the coverage (_spm_options)
    allowed = _fit_chars(sample, text, size, coverage, byte_fallback, key, len(symbols) + len(required))
    if allowed is not None and required:
        allowed |= set(required)  # in SentencePiece's text too, so that pieces may join them
    spm.set_random_generator_seed(config.data.seed)
    proto = _train_bytes(_spm_options(v, size, coverage, byte_fallback, symbols), sample, allowed, text, key)
    got = _write_model(proto, model)
    if got < size:
        warnings.warn(f"vocab.{key}={size} is more than {text} supports; trained {got} pieces", stacklevel=2)
    return {
        "vocab_size": got,
        "requested_size": size,
        "byte_fallback": byte_fallback,
        "split_digits": v.split_digits,
        "chars_limited": allowed is not None,
        "threads": SPM_THREADS,
    }


def _train_side(config: Config, sample: Path, model: Path, side: str, text: Path) -> tuple[dict, list[str]]:
    """`train_model` with its warnings returned rather than shown: a worker process's warnings
    would be lost, so they go back to `train_models`, which shows them in side order."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train_model(config, sample, model, side, text)
    return result, [str(w.message) for w in caught]


# Processes start from a forkserver where there is one: a fork of a process that already runs
# threads (PyTorch's, a server's, a pool's) can leave the child dead on arrival, which a test
# suite running many such things before `nmt vocab` saw now and then.
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else None


def _in_processes(fn: Callable, jobs: list[tuple], at_once: int, folder: Path) -> list:
    """`fn(*job)` for each job in processes of their own, `at_once` at a time, fresh ones per batch;
    results in job order. Every job of a batch ends (done or failed) before the batch's first
    failure, in job order, is raised; a process that died (killed, out of memory) is an NmtError.

    A process per batch gives its memory back to the system when it ends: the sample's Python
    objects and SentencePiece's arrays never stay in `nmt vocab`'s own process.
    """
    results: list = []
    for start in range(0, len(jobs), at_once):
        batch = jobs[start : start + at_once]
        context = multiprocessing.get_context(START_METHOD)
        with concurrent.futures.ProcessPoolExecutor(len(batch), mp_context=context) as pool:
            futures = [pool.submit(fn, *job) for job in batch]
            concurrent.futures.wait(futures)
        try:
            results += [f.result() for f in futures]
        except concurrent.futures.process.BrokenProcessPool:
            raise NmtError(
                f"vocab: a process training the vocabularies of {folder} died (out of memory? lower "
                "vocab.sample_chars); run `nmt vocab` again"
            ) from None
    return results


def _remove_partial_files(folder: Path) -> None:
    """Remove what a killed run left half-written in `folder` (`atomic_path`'s `.<name>.*.tmp`)."""
    for partial in folder.glob(".*.tmp"):
        partial.unlink(missing_ok=True)


def train_models(config: Config, run_dir: Path, langs: tuple[str, str]) -> dict:
    """Draw the sample `<run>/vocab/sample.{lang}` of the train split (pairs masked as they are
    drawn where pass-through is on) and train `<run>/vocab/{lang}.model` on it for both sides;
    returns {lang: train_model's dict + "sample"}."""
    v, run = config.vocab, RunDir(run_dir)
    folder, sources = run.vocab, tuple(run.corpus_file("train", lang) for lang in langs)
    samples = tuple(run.vocab_sample(lang) for lang in langs)
    _remove_partial_files(folder)
    prepare = pair_prep(config.data, "train")
    firsts = (_real_lines(run_dir, config, sources[0]), None)  # the source side: real text only
    (stats,) = _in_processes(
        draw_vocab_sample,
        [(sources, samples, v.sample_chars, v.max_sentences, config.data.seed, prepare, firsts)],
        1,
        folder,
    )
    jobs = [
        (config, sample, run.vocab_model(lang), side, source)
        for lang, side, sample, source in zip(langs, ("src", "tgt"), samples, sources, strict=True)
    ]
    results = _in_processes(_train_side, jobs, 2 if v.workers >= 2 else 1, folder)
    for _, caught in results:
        for message in caught:
            warn(message)
    return {lang: r | {"sample": s} for lang, (r, _), s in zip(langs, results, stats, strict=True)}


def _real_lines(run_dir: Path, config: Config, text: Path) -> int | None:
    """The lines of `text` (train's source side) before its back-translated pairs, which the
    corpus appends last (`corpus/stats.json`: backtranslation.kept); None without back-translation.
    Their source side is a reverse model's output, so the source vocabulary is trained without it;
    their target side is real monolingual text and stays in the target sample."""
    if config.data.backtranslation is None:
        return None
    stats = RunDir(run_dir).corpus_stats
    try:
        synthetic = json.loads(stats.read_text(encoding="utf-8"))["backtranslation"]["kept"]
    except (OSError, ValueError, KeyError, TypeError):
        raise NmtError(f"{stats}: no backtranslation.kept count; run `nmt download` again") from None
    return count_lines(text) - int(synthetic)


# --------------------------------------------------------------------------- encoding and report


def _encode_splits(config: Config, run_dir: Path, langs: tuple[str, str]) -> dict:
    """Encode every split of corpus/ into <run>/bin/{split}/ (train in shards; `nmt.data.encoded`),
    each pair prepared as SentencePiece saw it (`nmt.data.passthrough.pair_prep`); returns counts
    per split and language, and the pairs pass-through masked per split."""
    data, run = config.data, RunDir(run_dir)
    counts: dict = {"masked": {}}
    with Progress(console=Console(stderr=True), transient=True) as progress:
        for split in SPLITS:
            sides = [TextSide(lang, run.corpus_file(split, lang), run.vocab_model(lang)) for lang in langs]
            task = progress.add_task(f"encode {split}", total=count_lines(sides[0].text))
            shard_pairs = SHARD_PAIRS if split == "train" else None  # valid/test: one shard, in order
            encoded = encode_split(
                run.bin, split, sides, data.seed, shard_pairs, config.vocab.workers,
                on_progress=lambda n: progress.advance(task, n),  # noqa: B023 — used in this iteration
                prepare=pair_prep(data, split),
            )  # fmt: skip
            counts |= {f"{split}.{lang}": encoded[lang] for lang in langs}
            counts["masked"][split] = {
                "pairs": encoded[langs[0]]["sentences"],
                "masked_pairs": encoded["changed_pairs"],
            }
    return counts


class _Stopwatch:
    """Wall seconds of the steps of a build, in order: `lap(name)` ends the step `name`."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 3)
        self._last = now


def _report(models: dict, counts: dict, langs: tuple[str, str]) -> dict:
    report: dict = {}
    for lang in langs:
        valid = counts[f"valid.{lang}"]
        report[lang] = models[lang] | {
            "valid_unk_rate": valid["unk"] / max(valid["tokens"], 1),
            "valid_pieces_per_sentence": valid["tokens"] / max(valid["sentences"], 1),
        }
    report["splits"] = counts
    return report


def print_report(report: dict, langs: tuple[str, str], console: Console | None = None) -> None:
    table = Table(title="vocabulary")
    for col in ("lang", "vocab size", "valid unk rate", "valid pieces/sentence"):
        table.add_column(col, justify="left" if col == "lang" else "right")
    for lang in langs:
        r = report[lang]
        row = (
            str(r["vocab_size"]),
            f"{r['valid_unk_rate']:.4%}",
            f"{r['valid_pieces_per_sentence']:.2f}",
        )
        table.add_row(lang, *row)
    console = console or Console(stderr=True)
    console.print(table)
    if report.get("seconds"):
        console.print("vocab: " + ", ".join(f"{step} {sec:,.1f} s" for step, sec in report["seconds"].items()))


def _outputs(run_dir: Path, langs: tuple[str, str]) -> list[Path]:
    run = RunDir(run_dir)
    return [run.vocab_model(lang) for lang in langs] + [run.encoded_manifest(s) for s in SPLITS]


def init_source_run(config: Config) -> Path:
    """The run directory of `train.init_from` (the checkpoint's `checkpoints/` folder's parent)."""
    return checkpoint_run(Path(config.train.init_from))


def _source_models(config: Config) -> list[Path]:
    """The SentencePiece models a fine-tuning run reuses (those of `train.init_from`'s run)."""
    source = RunDir(init_source_run(config))
    models = [source.vocab_model(lang) for lang in (config.data.src_lang, config.data.tgt_lang)]
    for model in models:
        if not model.is_file():
            raise NmtError(f"train.init_from: {model} not found (the vocabulary of the run the checkpoint belongs to)")
    return models


def check_vocab_copied(config: Config, run_dir: Path) -> None:
    """NmtError (one line) unless `run_dir`'s vocabularies are `train.init_from`'s run's, byte for byte."""
    for source in _source_models(config):
        mine = RunDir(run_dir).vocab / source.name
        if not mine.is_file() or mine.read_bytes() != source.read_bytes():
            raise NmtError(
                f"{mine}: not the vocabulary of train.init_from's run ({source}); run `nmt vocab` "
                "(it copies that run's vocabularies and encodes this run's corpus with them)"
            )


def _copy_models(config: Config, run_dir: Path) -> dict:
    """Fine-tuning: the source run's SentencePiece models copied into `run_dir`/vocab (atomically)."""
    models, run = {}, RunDir(run_dir)
    for source, lang in zip(_source_models(config), (config.data.src_lang, config.data.tgt_lang), strict=True):
        for suffix in (".model", ".vocab"):
            if source.with_suffix(suffix).is_file():
                with atomic_path(run.vocab_model(lang).with_suffix(suffix)) as tmp:
                    shutil.copyfile(source.with_suffix(suffix), tmp)
        models[lang] = {
            "vocab_size": Tokenizer(run.vocab_model(lang)).vocab_size,
            "copied_from": str(source),
        }
    return models


def build_vocab(config: Config, run_dir: Path) -> dict:
    """Train both SentencePiece models (or, with `train.init_from`, copy those of that checkpoint's
    run) and encode all splits; return the report.

    Skipped (report read back from the stamp) when corpus files and vocab/data config are unchanged.
    """
    run_dir, run, data = Path(run_dir), RunDir(run_dir), config.data
    langs = (data.src_lang, data.tgt_lang)
    corpus = [run.corpus_file(s, lang) for s in SPLITS for lang in langs]
    for p in corpus:
        if not p.is_file():
            raise NmtError(f"{p}: not found; run `nmt download` first")
    stamped = stamp_sections(config)
    settings = {k: v for k, v in stamped["data"].items() if k != "mirror"}
    reused = _source_models(config) if config.train.init_from else []
    digest = hash_files(corpus + reused, extra={"vocab": stamped["vocab"], "data": settings})
    if stage_is_done(run_dir, "vocab", digest) and all(p.is_file() for p in _outputs(run_dir, langs)):
        Console(stderr=True).print(f"vocab: {run.vocab} is up to date (skipped)")
        return json.loads(run.stamp("vocab").read_text(encoding="utf-8"))["report"]
    clear_stamp(run_dir, "vocab")
    clock = _Stopwatch()
    models = _copy_models(config, run_dir) if reused else train_models(config, run_dir, langs)
    clock.lap("models")
    counts = _encode_splits(config, run_dir, langs)
    clock.lap("encode")
    masked = counts.pop("masked")
    report = _report(models, counts, langs) | {"seconds": clock.laps}
    if data.passthrough:
        report["passthrough"] = masked
    print_report(report, langs)
    write_stamp(run_dir, "vocab", digest, {"report": report})
    return report
