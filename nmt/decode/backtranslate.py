"""`nmt backtranslate`: monolingual text of the target language → synthetic parallel pairs.

A *reverse* model (e.g. an en-zh run, for a zh-en system) translates cleaned monolingual
sentences (`nmt.data.mono`) of its source language; each sentence and its translation become
one pair of a mirror directory in the Hugging Face translation schema:

    <output>/train.jsonl   {"translation": {"en": <the sentence, verbatim>, "zh": <its translation>}}
    <output>/stats.json    read / kept / dropped per cleaning rule, engine, precision, speed

Any engine, precision and search (beam, greedy, sampling) of `nmt translate` can be used;
`no_repeat_ngram` (default 3) overrides the reverse run's `decode.no_repeat_ngram`: a weak
reverse model's typical failure is a loop of one or two pieces ("我把把把…"); with n = 3 a
piece or a pair of pieces may occur twice in a row but never three times, while a legitimate
repeat of three pieces is rare in a sentence. A reverse model whose recorded validation BLEU is
below `min_valid_bleu` is refused before anything is written (`nmt.decode.valid_score`).
Resumable: sentences are translated in chunks; after each chunk the pairs are appended to
`train.jsonl.partial` and flushed, then `progress.json` records how many lines and bytes are
complete (atomically). An interrupted run, started again with the same command, cuts the
partial file back to the last complete chunk and goes on from there, so no line is duplicated
or lost; the finished file appears under its final name only at the end. The inputs (text,
checkpoint, settings) are fingerprinted: a different command aimed at the same output is refused.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from nmt.config import Config
from nmt.data.mono import HubText, mono_source, read_mono
from nmt.decode.options import InferenceOptions
from nmt.decode.translator import Translator
from nmt.decode.valid_score import MIN_VALID_BLEU, require_valid_bleu
from nmt.errors import NmtError
from nmt.files import atomic_write_json
from nmt.run.checkpoints import choose_inference_checkpoint
from nmt.run.dirs import checkpoint_run, resolve_run
from nmt.run.layout import RunDir
from nmt.run.stamps import hash_files

PARTIAL, PROGRESS, OUTPUT, STATS = "train.jsonl.partial", "progress.json", "train.jsonl", "stats.json"


@dataclass(frozen=True, kw_only=True)
class BacktranslateOptions:
    """The reverse model and how it decodes (`inference`), the monolingual text, the output folder."""

    inference: InferenceOptions
    mono: Path | str  # a file, a mirror directory, or hub:NAME?... (nmt.data.mono)
    output: Path
    chunk: int = 500  # sentences translated between two progress records
    no_repeat_ngram: int | None = 3  # the search's decode.no_repeat_ngram (module docstring); None: the run's
    min_valid_bleu: float = MIN_VALID_BLEU  # refuse a reverse model scoring below this on validation; 0 = off


def backtranslate(opts: BacktranslateOptions, on_chunk: Callable[[int, int], None] | None = None) -> dict:
    """Translate the cleaned text of `opts.mono` into `opts.output` (see the module docstring);
    returns the stats. `on_chunk(done, total)` is called after each chunk is recorded."""
    if opts.chunk < 1:
        raise NmtError(f"--chunk {opts.chunk}: must be >= 1")
    if opts.no_repeat_ngram is not None and opts.no_repeat_ngram < 0:
        raise NmtError(f"--no-repeat-ngram {opts.no_repeat_ngram}: must be >= 0 (0 = off)")
    config, checkpoint = _reverse_model(opts)
    print(f"reverse model: {require_valid_bleu(checkpoint, opts.min_valid_bleu)}", file=sys.stderr)
    translator = Translator.from_options(opts.inference, config)
    data, run_dir = translator.config.data, checkpoint_run(translator.checkpoint)
    real, synthetic = data.src_lang, data.tgt_lang
    path = mono_source(opts.mono, real)
    text = read_mono(path, data, held_out=_references(run_dir, real))
    print(f"monolingual: {path}: {_describe(text.report())}", file=sys.stderr)
    out = Path(opts.output)
    fingerprint = _fingerprint(path, translator, opts.inference, translator.config.decode.no_repeat_ngram)
    if (out / OUTPUT).is_file() and _stored(out / STATS).get("fingerprint") == fingerprint:
        print(f"{out / OUTPUT}: already complete (skipped)", file=sys.stderr)
        return _stored(out / STATS)
    done, start = _resume(out, fingerprint), time.perf_counter()
    with open(out / PARTIAL, "ab") as f:
        for first in range(done, len(text.lines), opts.chunk):
            lines = text.lines[first : first + opts.chunk]
            hyps = translator.translate(lines, beam=opts.inference.beam)
            f.write(b"".join(_record(real, line, synthetic, hyp) for line, hyp in zip(lines, hyps, strict=True)))
            f.flush()
            os.fsync(f.fileno())
            done = first + len(lines)
            atomic_write_json(out / PROGRESS, {"fingerprint": fingerprint, "lines": done, "bytes": f.tell()})
            if on_chunk is not None:
                on_chunk(done, len(text.lines))
    seconds = time.perf_counter() - start
    stats = {**text.report(), "fingerprint": fingerprint, "source": str(path), "pairs": len(text.lines)}
    stats |= {"engine": translator.engine.name, "precision": translator.precision, "seconds": round(seconds, 2)}
    stats["decode"] = asdict(opts.inference) | {"run_dir": str(run_dir), **_search(translator)}
    os.replace(out / PARTIAL, out / OUTPUT)
    atomic_write_json(out / STATS, json.loads(json.dumps(stats, default=str)))
    (out / PROGRESS).unlink(missing_ok=True)
    return stats


def _reverse_model(opts: BacktranslateOptions) -> tuple[Config, Path]:
    """The reverse run's config, with `opts.no_repeat_ngram` as its decode.no_repeat_ngram unless
    None, and the checkpoint (or export directory) it decodes with: known before any model is
    loaded, so that a model below the floor is refused at once."""
    inference = opts.inference
    config, run = resolve_run(None, str(inference.run_dir) if inference.run_dir is not None else None, need_model=True)
    if opts.no_repeat_ngram is not None:
        config = replace(config, decode=replace(config.decode, no_repeat_ngram=opts.no_repeat_ngram))
    checkpoint = Path(inference.checkpoint) if inference.checkpoint is not None else None
    return config, checkpoint or choose_inference_checkpoint(run).path


def _search(translator: Translator) -> dict:
    return {"no_repeat_ngram": translator.config.decode.no_repeat_ngram}


def _record(real_lang: str, real: str, synthetic_lang: str, synthetic: str) -> bytes:
    pair = {"translation": {real_lang: real, synthetic_lang: synthetic}}
    return (json.dumps(pair, ensure_ascii=False) + "\n").encode("utf-8")


def _resume(out: Path, fingerprint: str) -> int:
    """Lines already complete in `out`'s partial file (cut back to the last recorded chunk); 0 for
    a fresh start. NmtError when `out` holds the work of another command."""
    out.mkdir(parents=True, exist_ok=True)
    progress = _stored(out / PROGRESS)
    partial = out / PARTIAL
    if not progress or not partial.is_file():
        partial.write_bytes(b"")
        return 0
    if progress.get("fingerprint") != fingerprint:
        raise NmtError(
            f"{out}: holds an unfinished back-translation of other text, model or settings; "
            "use another --output or delete it"
        )
    with open(partial, "r+b") as f:
        f.truncate(int(progress["bytes"]))  # a chunk written after the last record is done again
    print(f"resuming {partial} after {progress['lines']} lines", file=sys.stderr)
    return int(progress["lines"])


def _stored(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _fingerprint(source: Path | HubText, translator: Translator, inference: InferenceOptions, no_repeat: int) -> str:
    """What an output is made from: the text (a file's bytes, or a hub split's name), the model
    (a checkpoint's bytes, or an `nmt export` directory's manifest) and the decoding settings."""
    model = Path(translator.checkpoint)
    model = model / "manifest.json" if model.is_dir() else model
    files = [model] if isinstance(source, HubText) else [Path(source), model]
    hub = str(source) if isinstance(source, HubText) else None
    settings = {"inference": asdict(inference), "hub": hub}
    if no_repeat:  # outputs written before the setting existed keep their fingerprint
        settings["no_repeat_ngram"] = no_repeat
    return hash_files(files, settings)[:32]


def _references(run_dir: Path, lang: str) -> list[str]:
    """The run's validation and test references in `lang` (what the overlap guard keeps out)."""
    lines: list[str] = []
    for split in ("valid", "test"):
        path = RunDir(run_dir).corpus_file(split, lang)
        if path.is_file():
            lines += path.read_text(encoding="utf-8").splitlines()
    return lines


def _describe(report: dict) -> str:
    dropped = ", ".join(f"{rule} {n}" for rule, n in report["dropped"].items() if n)
    return f"{report['read']} read, {report['kept']} kept" + (f" (dropped: {dropped})" if dropped else "")
