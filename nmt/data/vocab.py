"""Two SentencePiece models (source, target) with shared special ids, and the encoded splits.

`build_vocab` trains `<run>/vocab/{zh,en}.model` (named by data.src_lang / data.tgt_lang) on the
cleaned train text, then encodes every
split into `<run>/bin` (valid/test sources and references pass through `normalize_source` /
`normalize_target` first, as train did). SentencePiece's own normalisation is off ("identity"):
`nmt.data.corpus.normalize_*` is the one place text is normalised.

Pass-through (`data.passthrough`, nmt/data/passthrough.py): the placeholders `⦅0⦆…` are
user-defined symbols of both models, and SentencePiece trains on, and every split is encoded
from, normalised copies in which spans found on both sides of a pair are masked (`corpus/`
stays raw, so references are untouched).

The stage stamp covers the corpus files, the vocab and data sections, so a changed corpus or
vocabulary redoes both the models and the encoding.

A vocabulary too small for the characters a coverage requires: with byte fallback only the most
frequent characters that fit are kept in SentencePiece's training text (rarer ones become byte
pieces, still no `<unk>`); without it this is an `NmtError` naming the size key. A size larger
than the corpus supports is trained with `hard_vocab_limit=False` (a smaller model, reported).
"""

from __future__ import annotations

import collections
import functools
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import sentencepiece as spm
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from nmt import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt.config import BT_TAG, Config, VocabConfig, stamp_sections
from nmt.data.encoded import SHARD_PAIRS, TextSide, encode_split, manifest_path
from nmt.data.normalize import normalize_source, normalize_target
from nmt.data.passthrough import PLACEHOLDERS, masked_corpus
from nmt.data.readers import count_lines
from nmt.data.recipes import SPLITS
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.files import atomic_path
from nmt.runs import checkpoint_run, clear_stamp, hash_files, is_fresh, stamp_path, write_stamp

_META_PIECES = 4  # pad, unk, bos, eos
_BYTE_PIECES = 256


# --------------------------------------------------------------------------- training


def _char_counts(path: Path, max_lines: int) -> collections.Counter:
    """Character frequencies as SentencePiece sees them (a space or line start is one '▁')."""
    counts: collections.Counter = collections.Counter()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if n >= max_lines:
                break
            counts.update(line.rstrip("\n").replace(" ", "▁"))
            counts["▁"] += 1
    return counts


def _fit_chars(
    path: Path, size: int, coverage: float, byte_fallback: bool, key: str, max_lines: int, symbols: int = 0
) -> set[str] | None:
    """None when the characters `coverage` requires fit in `size`; else the most frequent ones that do.

    SentencePiece refuses a coverage below 0.98, so with byte fallback the rarer characters are
    instead left out of its training text (they encode as byte pieces).
    """
    counts = _char_counts(path, max_lines)
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
            f"vocab.{key}={size} is too small for {path}: coverage {coverage} needs {needed} characters plus "
            f"{reserved} special/byte pieces; use vocab.{key} >= {needed + reserved}"
        )
    keep = room - max(1, room // 10)  # leave room for a few multi-character pieces
    allowed = {c for c, _ in counts.most_common(keep)} | {"▁"}
    share = sum(counts[c] for c in allowed) / total
    warnings.warn(
        f"vocab.{key}={size}: {keep} of {needed} characters fit ({share:.1%} of text); rest use bytes", stacklevel=3
    )
    return allowed


def _filtered_copy(text: Path, dest: Path, allowed: set[str], max_lines: int) -> Path:
    with open(text, encoding="utf-8") as f, open(dest, "w", encoding="utf-8") as out:
        for n, line in enumerate(f):
            if n >= max_lines:
                break
            out.write("".join(c for c in line.rstrip("\n") if c == " " or c in allowed) + "\n")
    return dest


def _spm_options(v: VocabConfig, text: Path, prefix: Path, size: int, coverage: float, byte_fallback: bool) -> dict:
    return {
        "input": str(text),
        "model_prefix": str(prefix),
        "model_type": v.type,
        "vocab_size": size,
        "character_coverage": coverage,
        "byte_fallback": byte_fallback,
        "pad_id": PAD_ID,
        "unk_id": UNK_ID,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "input_sentence_size": v.max_sentences,
        "shuffle_input_sentence": True,
        "normalization_rule_name": "identity",
        "num_threads": 2,
        "minloglevel": 2,
    }


def train_model(config: Config, text: Path, model: Path, side: str) -> dict:
    """Train one SentencePiece model (side "src" or "tgt") from `text` into `model` (+ .vocab), atomically."""
    v, key = config.vocab, f"{side}_size"
    size, coverage = (v.src_size, v.src_coverage) if side == "src" else (v.tgt_size, v.tgt_coverage)
    chinese = (config.data.src_lang if side == "src" else config.data.tgt_lang) == "zh"
    coverage = coverage if coverage is not None else (0.9995 if chinese else 1.0)  # by language
    byte_fallback = v.byte_fallback and chinese  # rare characters as bytes: never <unk> on the zh side
    symbols = list(PLACEHOLDERS) if config.data.passthrough else []  # pass-through placeholders, never split
    bt = config.data.backtranslation
    if side == "src" and bt is not None and bt.tag:
        symbols.append(BT_TAG)  # one piece of the source vocabulary, which the target never has
    allowed = _fit_chars(text, size, coverage, byte_fallback, key, v.max_sentences, len(symbols))
    model.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{model.stem}.", dir=model.parent))
    try:
        source = _filtered_copy(text, tmp_dir / "input.txt", allowed, v.max_sentences) if allowed else text
        opts = _spm_options(v, source, tmp_dir / "m", size, coverage, byte_fallback)
        if symbols:
            opts["user_defined_symbols"] = symbols
        spm.set_random_generator_seed(config.data.seed)
        try:
            spm.SentencePieceTrainer.train(**opts)
        except RuntimeError as e:
            if "Vocabulary size too high" not in str(e):
                raise NmtError(
                    f"vocab.{key}={size}: SentencePiece failed on {text}: {str(e).splitlines()[0]}"
                ) from None
            spm.SentencePieceTrainer.train(**opts, hard_vocab_limit=False)
        os.replace(tmp_dir / "m.vocab", model.with_suffix(".vocab"))
        os.replace(tmp_dir / "m.model", model)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    got = spm.SentencePieceProcessor(model_file=str(model)).get_piece_size()
    if got < size:
        warnings.warn(f"vocab.{key}={size} is more than {text} supports; trained {got} pieces", stacklevel=2)
    return {
        "vocab_size": got,
        "requested_size": size,
        "byte_fallback": byte_fallback,
        "chars_limited": allowed is not None,
    }


# --------------------------------------------------------------------------- encoding and report


def _encode_splits(config: Config, run_dir: Path, langs: tuple[str, str], masked: dict | None = None) -> dict:
    """Encode every split into <run>/bin/{split}/ (train in shards; `nmt.data.encoded`); returns
    counts per split and language.

    `masked` (from `nmt.data.passthrough.masked_corpus`): normalised, masked texts to encode instead.
    """
    data, corpus = config.data, run_dir / "corpus"
    normalizers = {"train": (None, None)}
    normalizers |= dict.fromkeys(
        ("valid", "test"),
        (None, None)
        if masked
        else (functools.partial(normalize_source, data=data), functools.partial(normalize_target, data=data)),
    )
    counts: dict = {}
    with Progress(console=Console(stderr=True), transient=True) as progress:
        for split in SPLITS:
            sides = []
            for lang, normalize in zip(langs, normalizers[split], strict=True):
                text = masked[f"{split}.{lang}"] if masked else corpus / f"{split}.{lang}"
                sides.append(TextSide(lang, text, run_dir / "vocab" / f"{lang}.model", normalize))
            tasks = {s.lang: progress.add_task(f"encode {split}.{s.lang}", total=count_lines(s.text)) for s in sides}
            shard_pairs = SHARD_PAIRS if split == "train" else None  # valid/test: one shard, in order
            encoded = encode_split(
                run_dir / "bin", split, sides, data.seed, shard_pairs, config.vocab.workers,
                on_progress=lambda lang, n: progress.advance(tasks[lang], n),  # noqa: B023 — used in this iteration
            )  # fmt: skip
            counts |= {f"{split}.{lang}": c for lang, c in encoded.items()}
    return counts


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
    (console or Console(stderr=True)).print(table)


def _outputs(run_dir: Path, langs: tuple[str, str]) -> list[Path]:
    models = [run_dir / "vocab" / f"{lang}.model" for lang in langs]
    return models + [manifest_path(run_dir, s) for s in SPLITS]


def init_source_run(config: Config) -> Path:
    """The run directory of `train.init_from` (the checkpoint's `checkpoints/` folder's parent)."""
    return checkpoint_run(Path(config.train.init_from))


def _source_models(config: Config) -> list[Path]:
    """The SentencePiece models a fine-tuning run reuses (those of `train.init_from`'s run)."""
    source = init_source_run(config) / "vocab"
    models = [source / f"{lang}.model" for lang in (config.data.src_lang, config.data.tgt_lang)]
    for model in models:
        if not model.is_file():
            raise NmtError(f"train.init_from: {model} not found (the vocabulary of the run the checkpoint belongs to)")
    return models


def check_vocab_copied(config: Config, run_dir: Path) -> None:
    """NmtError (one line) unless `run_dir`'s vocabularies are `train.init_from`'s run's, byte for byte."""
    for source in _source_models(config):
        mine = Path(run_dir) / "vocab" / source.name
        if not mine.is_file() or mine.read_bytes() != source.read_bytes():
            raise NmtError(
                f"{mine}: not the vocabulary of train.init_from's run ({source}); run `nmt vocab` "
                "(it copies that run's vocabularies and encodes this run's corpus with them)"
            )


def _copy_models(config: Config, run_dir: Path) -> dict:
    """Fine-tuning: the source run's SentencePiece models copied into `run_dir`/vocab (atomically)."""
    models = {}
    for source, lang in zip(_source_models(config), (config.data.src_lang, config.data.tgt_lang), strict=True):
        for suffix in (".model", ".vocab"):
            if source.with_suffix(suffix).is_file():
                with atomic_path(run_dir / "vocab" / f"{lang}{suffix}") as tmp:
                    shutil.copyfile(source.with_suffix(suffix), tmp)
        models[lang] = {
            "vocab_size": Tokenizer(run_dir / "vocab" / f"{lang}.model").vocab_size,
            "copied_from": str(source),
        }
    return models


def build_vocab(config: Config, run_dir: Path) -> dict:
    """Train both SentencePiece models (or, with `train.init_from`, copy those of that checkpoint's
    run) and encode all splits; return the report.

    Skipped (report read back from the stamp) when corpus files and vocab/data config are unchanged.
    """
    run_dir, data = Path(run_dir), config.data
    langs = (data.src_lang, data.tgt_lang)
    corpus = [run_dir / "corpus" / f"{s}.{lang}" for s in SPLITS for lang in langs]
    for p in corpus:
        if not p.is_file():
            raise NmtError(f"{p}: not found; run `nmt download` first")
    stamped = stamp_sections(config)
    settings = {k: v for k, v in stamped["data"].items() if k != "mirror"}
    reused = _source_models(config) if config.train.init_from else []
    digest = hash_files(corpus + reused, extra={"vocab": stamped["vocab"], "data": settings})
    if is_fresh(run_dir, "vocab", digest) and all(p.is_file() for p in _outputs(run_dir, langs)):
        Console(stderr=True).print(f"vocab: {run_dir / 'vocab'} is up to date (skipped)")
        return json.loads(stamp_path(run_dir, "vocab").read_text(encoding="utf-8"))["report"]
    clear_stamp(run_dir, "vocab")
    with masked_corpus(config, run_dir, SPLITS) as masked:  # None when pass-through is off
        texts = masked or {f"train.{lang}": run_dir / "corpus" / f"train.{lang}" for lang in langs}
        models = (
            _copy_models(config, run_dir)
            if reused
            else {
                lang: train_model(config, texts[f"train.{lang}"], run_dir / "vocab" / f"{lang}.model", side)
                for lang, side in zip(langs, ("src", "tgt"), strict=True)
            }
        )
        report = _report(models, _encode_splits(config, run_dir, langs, masked), langs)
        if masked:
            report["passthrough"] = masked["stats"]
    print_report(report, langs)
    write_stamp(run_dir, "vocab", digest, {"report": report})
    return report
