"""Translator: Chinese text in, English text out, with a trained run's model and vocabularies.

Every input line goes through `nmt.data.corpus.normalize_source` (NFKC, Traditional→Simplified...,
exactly what training did to the source side), the source SentencePiece model, and at most
`model.max_positions - 1` pieces (+ EOS; longer lines are truncated with one warning on stderr
naming the line number). Blank lines give empty outputs without reaching the model.

Pass-through spans (Latin words, numbers, URLs, e-mails, marked text; nmt/data/passthrough.py) are
replaced by placeholders after normalisation and restored in each output, when the run's
vocabularies hold the placeholders; `self.masks` keeps the spans of the last encoded lines.

Lines are decoded in length-sorted batches bounded by `decode.max_tokens` (padded source
tokens) and `decode.batch_size` (sentences); outputs come back in input order. `beam=1` uses
greedy search (the same output as a beam of one, faster), except in `translate_nbest`, which
needs the scores.

Threads: `translate`, `translate_nbest` and `encode` may run on several threads at once (the
workers of `nmt serve`); `encode_sources` keeps its masks on the instance and may not.

N-best: `translate_nbest` returns each input's hypotheses as `(text, score)` lists, best first.
`translate` and `translate_stream` return one string per input; with `nbest > 1` that string
holds n lines `score<TAB>text` (best first; score = the beam's length-normalised log-probability,
4 decimals), which is what `nmt translate --nbest` prints: n lines per input.
"""

from __future__ import annotations

import io
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt import BOS_ID, EOS_ID, PAD_ID
from nmt.config import Config
from nmt.contracts import Engine, TokenizerLike
from nmt.data.passthrough import Masked, mask, masker, restore
from nmt.decode.options import InferenceOptions, Sampling
from nmt.errors import NmtError

if TYPE_CHECKING:
    import torch

CHUNK_LINES = 2000  # lines read ahead (and sorted by length) by translate_stream


@dataclass
class DecodeStats:
    """Counters of the decoding work done (accumulated until `reset`)."""

    sentences: int = 0  # non-empty lines sent to the model
    src_tokens: int = 0  # source pieces, EOS included
    tgt_tokens: int = 0  # pieces of the best hypotheses, EOS excluded
    seconds: float = 0.0  # wall time inside the model's searches

    def reset(self) -> None:
        self.sentences = self.src_tokens = self.tgt_tokens = 0
        self.seconds = 0.0


class Translator:
    """An engine (model + search), its source/target tokenizers, and the config it was trained with.

    Built from a model (the native engine is made around it) or, with `engine=`, from any
    object with the engine interface of `nmt/decode/engines.py` (then `model` may be None).
    """

    def __init__(
        self,
        model: torch.nn.Module | None,
        src_tok: TokenizerLike,
        tgt_tok: TokenizerLike,
        config: Config,
        device: torch.device | str = "cpu",
        precision: str = "fp32",
        checkpoint: Path | None = None,
        engine: Engine | None = None,
    ) -> None:
        if engine is None:
            from nmt.decode.engines import NativeEngine  # PyTorch: imported only where it decodes

            engine = NativeEngine(model, config.decode, device, precision)
        self.engine = engine
        self.model = getattr(engine, "model", model)
        self.device = getattr(engine, "device", device)  # torch.device, or the CTranslate2 engine's own
        self.precision = getattr(engine, "precision", precision)
        self.src_tok, self.tgt_tok, self.config = src_tok, tgt_tok, config
        self.checkpoint = checkpoint
        self.max_src_pieces = config.model.max_positions - 1  # + EOS
        self.stats = DecodeStats()
        self._stats_lock = threading.Lock()
        self.masker = masker(config.data, src_tok, tgt_tok)  # pass-through spans (nmt/data/passthrough.py)
        self.masks: list[Masked | None] = []  # per line of the last `encode_sources` call
        self.sampling: Sampling | None = None  # set: every line is sampled (`nmt.decode.token_sampling`), beam unused

    @classmethod
    def from_run(
        cls, run_dir: Path, checkpoint: Path | None = None, *, config: Config | None = None, **options: Any
    ) -> Translator:
        """`from_options` for the run `run_dir`: `options` are any of `InferenceOptions`' loading
        fields (device, precision, engine, sampling, ensemble, threads, rows); the rest of them are
        its defaults, the same for every way in (CLI, server, scripts)."""
        searching = sorted(set(options) & {"beam", "nbest", "len_penalty"})
        if searching:  # InferenceOptions has them, but a translator takes them per call
            raise TypeError(f"from_run() got {', '.join(searching)}: pass it to translate()")
        opts = InferenceOptions(run_dir=Path(run_dir), checkpoint=checkpoint, **options)
        return cls._load(Path(run_dir), opts, config)

    @classmethod
    def from_options(cls, opts: InferenceOptions, config: Config | None = None) -> Translator:
        """The translator of `opts`: its run (default: the newest with a model), checkpoint
        (default: `nmt.run.checkpoints.choose_inference_checkpoint`), engine, device and
        precision. The architecture comes from the checkpoint's stored config; the rest (data
        normalisation, decode settings) from `config`, else `<run>/config.yaml`, else the
        checkpoint. Says on stderr which checkpoint (path, step, why) it loaded."""
        from nmt.run.dirs import resolve_run

        _, run = resolve_run(None, str(opts.run_dir) if opts.run_dir is not None else None, need_model=True)
        return cls._load(run, opts, config)

    @classmethod
    def _load(cls, run_dir: Path, opts: InferenceOptions, config: Config | None) -> Translator:
        """The translator around what `nmt.decode.loading.load` built for `opts` and `run_dir`; says
        on stderr what it loaded and how it decodes: 'loaded <checkpoint> (step N; why); --engine
        auto: ctranslate2; ctranslate2 fp32'."""
        from nmt.decode.loading import load

        loaded = load(opts, run_dir, config)
        translator = cls(
            None, loaded.src_tok, loaded.tgt_tok, loaded.config, checkpoint=loaded.checkpoint, engine=loaded.engine
        )
        translator.sampling = opts.sampling
        if not opts.passthrough:
            translator.masker = None  # the raw path: the text goes to SentencePiece as it is
        print(f"{loaded.said}; {decodes_with(loaded.engine)}", file=sys.stderr)
        return translator

    # ----------------------------------------------------------------------- public API

    def translate(
        self, lines: list[str], beam: int | None = None, nbest: int = 1, len_penalty: float | None = None
    ) -> list[str]:
        """One output string per input line (nbest > 1: n lines `score<TAB>text` joined by "\\n")."""
        return list(self.translate_stream(lines, beam=beam, nbest=nbest, len_penalty=len_penalty))

    def translate_nbest(
        self,
        lines: list[str],
        beam: int | None = None,
        nbest: int | None = None,
        len_penalty: float | None = None,
        on_line: Callable[[int, list[tuple[str, float]]], None] | None = None,
    ) -> list[list[tuple[str, float]]]:
        """Up to `nbest` (default decode.nbest) `(text, score)` pairs per line, best first; [] for blank lines.
        `on_line(i, pairs)` hears of line i as soon as the engine has it (the native beam search:
        when the sentence is done, before the rest of its batch), on the calling thread."""
        nbest = nbest or self.config.decode.nbest
        return self._translate_chunk(list(lines), 1, beam, nbest, len_penalty, True, on_line)

    def translate_stream(
        self,
        lines: Iterable[str],
        beam: int | None = None,
        nbest: int = 1,
        len_penalty: float | None = None,
        chunk_lines: int = CHUNK_LINES,
    ) -> Iterator[str]:
        """Translate an iterable of lines (e.g. a file or stdin), `chunk_lines` at a time, in input order."""
        first, chunk = 1, []
        for line in lines:
            chunk.append(line.rstrip("\r\n"))
            if len(chunk) >= chunk_lines:
                yield from self._join(self._translate_chunk(chunk, first, beam, nbest, len_penalty), nbest)
                first, chunk = first + len(chunk), []
        if chunk:
            yield from self._join(self._translate_chunk(chunk, first, beam, nbest, len_penalty), nbest)

    # ----------------------------------------------------------------------- internals

    @staticmethod
    def _join(results: list[list[tuple[str, float]]], nbest: int) -> Iterator[str]:
        """One string per input: the text; with nbest > 1, `nbest` lines `score<TAB>text`, best
        first (a blank input gives `nbest` lines `nan<TAB>`), so every input has the same line count."""
        for hyps in results:
            if nbest == 1:
                yield hyps[0][0] if hyps else ""
                continue
            rows = [f"{score:.4f}\t{text}" for text, score in hyps[:nbest]]
            yield "\n".join(rows + ["nan\t"] * (nbest - len(rows)))

    def encode_sources(self, lines: list[str], first_line: int = 1) -> list[list[int]]:
        """Normalised, tokenised, truncated source pieces (no EOS) for each line; [] for blank lines.
        Their pass-through spans are left in `self.masks`."""
        ids, self.masks = self.encode(lines, first_line)
        return ids

    def encode(self, lines: list[str], first_line: int = 1) -> tuple[list[list[int]], list[Masked | None]]:
        """`encode_sources` without touching `self` (safe from several threads): ids and masks per line."""
        from nmt.data.normalize import normalize_source

        texts = [normalize_source(line, self.config.data) for line in lines]
        detector = self.masker
        masks = [mask(t, detector.find(t)) if detector else None for t in texts]
        texts = [m.text if m else t for m, t in zip(masks, texts, strict=True)]
        keep = [i for i, t in enumerate(texts) if t]
        ids: list[list[int]] = [[] for _ in lines]
        for i, seq in zip(keep, self.src_tok.encode_batch([texts[i] for i in keep]), strict=True):
            if len(seq) > self.max_src_pieces:
                print(
                    f"warning: line {first_line + i}: {len(seq)} source pieces, truncated to "
                    f"{self.max_src_pieces} (model.max_positions={self.max_src_pieces + 1})",
                    file=sys.stderr,
                )
                seq = seq[: self.max_src_pieces]
            ids[i] = list(seq)
        return ids, masks

    def batches(self, ids: list[list[int]]) -> list[list[int]]:
        """Indices of the non-empty sequences, longest first, grouped under the decode batch limits."""
        d = self.config.decode
        order = sorted((i for i, s in enumerate(ids) if s), key=lambda i: -len(ids[i]))
        out: list[list[int]] = []
        for i in order:
            if out:
                width = len(ids[out[-1][0]]) + 1  # the batch's first (longest) source + EOS
                if len(out[-1]) < d.batch_size and (len(out[-1]) + 1) * width <= d.max_tokens:
                    out[-1].append(i)
                    continue
            out.append([i])
        return out

    def _translate_chunk(
        self,
        lines: list[str],
        first_line: int,
        beam: int | None,
        nbest: int,
        len_penalty: float | None,
        scores: bool = False,
        on_line: Callable[[int, list[tuple[str, float]]], None] | None = None,
    ) -> list[list[tuple[str, float]]]:
        """(text, score) lists for each line; without `scores` a beam of 1 runs greedy search (score NaN)."""
        d = self.config.decode
        beam = d.beam if beam is None else beam
        lp = d.len_penalty if len_penalty is None else len_penalty
        if beam < 1 or not 1 <= nbest <= beam:
            raise NmtError(f"--nbest {nbest} must be between 1 and the beam size ({beam})")
        ids, masks = self.encode(lines, first_line)
        results: list[list[tuple[str, float]]] = [[] for _ in lines]

        def texts(i: int, found: list) -> list[tuple[str, float]]:
            return [(_restore(self.tgt_tok.decode(_clean(tokens)), masks[i]), s) for tokens, s in found]

        heard: set[int] = set()  # lines already detokenised for `on_line`

        def report(i: int, found: list) -> None:
            results[i] = texts(i, found)
            heard.add(i)
            on_line(i, results[i])

        for group in self.batches(ids):
            early = (lambda j, found, group=group: report(group[j], found)) if on_line is not None else None
            hyps = self._search([ids[i] for i in group], beam, nbest, lp, beam == 1 and not scores, early)
            for i, h in zip(group, hyps, strict=True):
                if i not in heard:
                    results[i] = texts(i, h)
        return results

    def _search(
        self, seqs: list[list[int]], beam: int, nbest: int, len_penalty: float, greedy: bool, on_done: Any = None
    ) -> list[list[tuple]]:
        """Decode one batch of source sequences; returns (tokens, score) lists, best first."""
        start = time.perf_counter()
        extra = {"sampling": self.sampling} if self.sampling is not None else {}  # engines without sampling work
        found = self.engine.search(seqs, beam, nbest, len_penalty, greedy, on_done, **extra)
        with self._stats_lock:  # `nmt serve` decodes on several threads
            self.stats.seconds += time.perf_counter() - start
            self.stats.sentences += len(seqs)
            self.stats.src_tokens += sum(len(s) + 1 for s in seqs)
            self.stats.tgt_tokens += sum(len(f[0][0]) for f in found if f)
        return found


def decodes_with(engine: Any) -> str:
    """'native fp32', 'native int8 (int8-weight)', 'ctranslate2 fp32': the engine and the precision
    it resolved to, as every `loaded …` line and the server's /info name them."""
    return getattr(engine, "describe", None) or f"{engine.name} {engine.precision}"


def _restore(text: str, masked: Masked | None) -> str:
    """Placeholders back to their source spans (nmt.data.passthrough.restore's rule)."""
    return restore(text, masked) if masked is not None else text


def _clean(tokens: list[int]) -> list[int]:
    """Drop special ids that must not reach the detokeniser (BOS/EOS/PAD)."""
    return [t for t in tokens if t not in (PAD_ID, BOS_ID, EOS_ID)]


# --------------------------------------------------------------------------- CLI helper


def translate_to(
    opts: InferenceOptions,
    texts: list[str] | None = None,
    input_path: Path | None = None,
    output_path: Path | None = None,
) -> int:
    """`nmt translate`: arguments, a file or stdin → stdout or a file (written atomically). Returns lines written."""
    from nmt.files import atomic_path

    translator = Translator.from_options(opts)
    beam, nbest, lp = opts.beam, opts.nbest, opts.len_penalty
    if texts:
        outputs: Iterable[str] = translator.translate_stream(texts, beam, nbest, lp)
        return _emit(outputs, output_path, atomic_path)
    if input_path is not None:
        if not Path(input_path).is_file():
            raise NmtError(f"{input_path}: input file not found")
        with open(input_path, encoding="utf-8-sig", errors="replace") as f:  # -sig: a leading BOM is dropped
            return _emit(translator.translate_stream(f, beam, nbest, lp), output_path, atomic_path)
    chunk = 1 if sys.stdin.isatty() else CHUNK_LINES  # interactive: answer each line at once
    if isinstance(sys.stdin, io.TextIOWrapper):
        sys.stdin.reconfigure(errors="replace")  # invalid UTF-8 becomes U+FFFD, as with --input
    return _emit(translator.translate_stream(sys.stdin, beam, nbest, lp, chunk), output_path, atomic_path)


def _emit(outputs: Iterable[str], output_path: Path | None, atomic_path: Any) -> int:
    n = 0
    if output_path is None:
        for line in outputs:
            print(line, flush=True)
            n += 1
        return n
    with atomic_path(Path(output_path)) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for line in outputs:
            f.write(line + "\n")
            n += 1
    return n
