"""CTranslate2: export a run's checkpoint to a CTranslate2 model directory, and decode with it.

Optional extra (`pip install 'nmt[ctranslate2]'`): this module imports without the package, and
every entry point raises a one-line `NmtError` naming the extra when it is missing.

Export (`export_run`; `nmt export --format ctranslate2`) converts with `nmt.decode.ct2_spec.NmtConverter`
(CTranslate2's own spec API, filled from nmt's state dict; the mapping is documented there).

Token i of each CTranslate2 vocabulary is SentencePiece piece i, the config adds EOS to every
source and starts the decoder with BOS, so an exported directory also works without nmt:
`sp.encode(text, out_type=str)` → `Translator.translate_batch` → `sp.decode(pieces)` (after
nmt's normalisation, `nmt.data.corpus.normalize_source`). Directory: model.bin, config.json,
{source,target}_vocabulary.json, both SentencePiece models, manifest.json (run, checkpoint,
step, config, versions, quantization, input digest).

Decoding (`CTranslate2Engine.search`) maps nmt's decode settings onto `translate_batch`:

- beam → beam_size (all `beam` finished hypotheses are fetched, re-ranked, cut to nbest);
  greedy → beam_size=1, without n-gram blocking (as nmt's greedy search).
- len_penalty → length_penalty, with return_end_token=True: CTranslate2 divides the summed
  log-probability by the hypothesis length to the power len_penalty, and with the end token
  that length counts the EOS like nmt's (len + 1) ** len_penalty. The EOS is stripped here.
- max_len = floor(max_len_a * src_len + max_len_b) (capped at max_positions - 1) is per sentence
  in nmt but per call in CTranslate2 (max_decoding_length): a batch is split into groups of
  equal limit, one call each, with max_decoding_length = max_len. At that limit nmt closes every
  open beam with a forced EOS, CTranslate2 returns it without one: such hypotheses are rescored
  here (`score_batch`: their log-probability plus that of the EOS, over (max_len + 1) **
  len_penalty) and the list re-ranked. Because CTranslate2 ranks them too high before that and
  returns only `beam` hypotheses, a sentence that reached its limit is decoded once more with
  patience 2 (same search, all finished hypotheses returned). Left over: where EOS candidates
  ranked among the top `beam` at the last free step, nmt closes the runners-up that replace
  them as well; CTranslate2 never saw those. Greedy outputs are the same tokens either way.
- min_len → min_decoding_length (EOS disabled while fewer tokens were generated, in both).
- no_repeat_ngram → no_repeat_ngram_size (both look at the generated tokens, BOS excluded).
- Stopping: both take the top 2K candidates per step, finish the EOS among the first K and stop
  a sentence at K finished hypotheses (patience 1). With len_penalty 0, CTranslate2 stops when
  the best beam finishes (same best hypothesis; lower n-best entries may differ).
- Masking: nmt sets disabled tokens to -inf *after* the log-softmax, CTranslate2 *before* it
  (renormalising). So PAD/BOS are not suppressed in CTranslate2 (that would shift every
  score by their label-smoothing mass, about 2·ε/V per token); hypotheses holding them are
  dropped from the n-best instead. The EOS disabled at step 0 by min_len shifts each sentence's
  scores by the same log(1 - p(EOS)), which can only reorder hypotheses of different lengths
  whose scores are within about that much (ε/V for a trained model).
- max_input_length=0: the Translator has already truncated sources to max_positions - 1.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import yaml

import nmt
from nmt import BOS_ID, EOS_ID, PAD_ID
from nmt.config import YAML_LOADER, Config, DecodeConfig, config_from_dict, config_to_dict, load_config
from nmt.decode.options import Sampling, cpu_threads
from nmt.errors import NmtError

try:
    import ctranslate2
except ImportError:  # the optional extra is not installed
    ctranslate2 = None

EXPORT_FORMATS = ("ctranslate2", "argos")  # dispatched by nmt/decode/export.py
MANIFEST = "manifest.json"
EXPORT_REVISION = 1  # bump when the layout of an export changes (stale caches are rebuilt)
INSTALL_HINT = "pip install 'nmt[ctranslate2]'"

# nmt precision → CTranslate2 compute type ("default": the type the weights were saved in)
COMPUTE_TYPES = {"auto": "default", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8"}


def require_ctranslate2() -> Any:
    """The `ctranslate2` module, or a one-line NmtError naming the optional extra."""
    if ctranslate2 is None:
        raise NmtError(f"CTranslate2 is not installed: {INSTALL_HINT}")
    return ctranslate2


def quantizations() -> tuple[str, ...]:
    """The weight types the installed converter accepts for --quantization."""
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    return tuple(ACCEPTED_MODEL_TYPES)


# --------------------------------------------------------------------------- export


@dataclass
class ExportOptions:
    """What `nmt export` writes: which run and checkpoint, where, in which weight type."""

    run_dir: Path
    checkpoint: Path | None = None  # None: the run's inference checkpoint (final > best > latest)
    output: Path | None = None  # None: <run>/export/ct2-<checkpoint>-<quantization>
    quantization: str | None = None  # None: float32 weights (see quantizations())
    format: str = "ctranslate2"


@dataclass
class _Source:
    """Everything an export is made from."""

    run_dir: Path
    checkpoint: Path
    config: Config  # the run's config, with the checkpoint's model section
    src_model: Path  # SentencePiece models
    tgt_model: Path


def _resolve_source(run_dir: Path, checkpoint: Path | None, config: Config | None = None) -> _Source:
    """The checkpoint (default: final > best > latest), config and vocabularies of a run, as
    `Translator.from_run` finds them; the weights themselves are read only when converting."""
    from nmt.checkpoint_files import find_inference_checkpoint, read_metadata
    from nmt.data.tokenizer import load_tokenizers

    run_dir = Path(run_dir)
    path = Path(checkpoint) if checkpoint is not None else find_inference_checkpoint(run_dir)
    meta = read_metadata(path)
    if "config" not in meta:
        raise NmtError(f"{path}: checkpoint has no config in its metadata (not written by nmt)")
    stored = config_from_dict(yaml.load(meta["config"], Loader=YAML_LOADER) or {}, source=f"{path}:config")
    if config is None:
        config = load_config(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else stored
    config = dataclasses.replace(config, model=dataclasses.replace(stored.model))
    src_tok, tgt_tok = load_tokenizers(run_dir, config)
    return _Source(run_dir, path, config, src_tok.path, tgt_tok.path)


def _digest(src: _Source, quantization: str | None) -> str:
    from nmt.runs import hash_files

    extra = {"quantization": quantization, "revision": EXPORT_REVISION, "ctranslate2": ctranslate2.__version__}
    return hash_files([src.checkpoint, src.src_model, src.tgt_model], extra)


def default_export_dir(run_dir: Path, checkpoint: Path, quantization: str | None) -> Path:
    """<run>/export/ct2-<checkpoint name>-<weight type>: the cache the engine reuses."""
    return Path(run_dir) / "export" / f"ct2-{Path(checkpoint).stem}-{quantization or 'float32'}"


def is_fresh(out: Path, digest: str) -> bool:
    """True when `out` holds a complete export of the same inputs (its manifest digest)."""
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return manifest.get("inputs") == digest and (out / "model.bin").is_file()


def _pieces(model: Path) -> list[str]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def _write_export(src: _Source, out: Path, quantization: str | None, digest: str) -> Path:
    """Convert into a temporary directory next to `out`, then swap it in (never half-written)."""
    from nmt.checkpoint import load_weights
    from nmt.checkpoint_files import checkpoint_step
    from nmt.decode.ct2_spec import NmtConverter  # CTranslate2's converter imports PyTorch

    state, _ = load_weights(src.checkpoint)
    converter = NmtConverter(state, src.config.model, (_pieces(src.src_model), _pieces(src.tgt_model)))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        try:
            converter.convert(str(tmp), quantization=quantization, force=True)
        except ValueError as e:  # the spec's own validation, e.g. a vocabulary of another size
            raise NmtError(f"{src.checkpoint}: CTranslate2 refused the model ({e})") from None
        shutil.copyfile(src.src_model, tmp / "source.model")
        shutil.copyfile(src.tgt_model, tmp / "target.model")
        manifest = {
            "format": "ctranslate2",
            "run": str(src.run_dir.resolve()),
            "checkpoint": str(src.checkpoint.resolve()),
            "step": checkpoint_step(src.checkpoint),
            "quantization": quantization or "float32",
            "source_model": "source.model",
            "target_model": "target.model",
            "nmt_version": nmt.__version__,
            "ctranslate2_version": ctranslate2.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "inputs": digest,
            "config": config_to_dict(src.config),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        old = out.parent / f".{out.name}.{os.getpid()}.old"
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def ensure_export(src: _Source, output: Path | None, quantization: str | None) -> Path:
    """The export directory of `src` in `quantization`: reused when its manifest matches, else (re)written."""
    require_ctranslate2()
    if quantization is not None and quantization not in quantizations():
        raise NmtError(f"--quantization {quantization!r}: expected one of {' | '.join(quantizations())}")
    out = Path(output) if output is not None else default_export_dir(src.run_dir, src.checkpoint, quantization)
    digest = _digest(src, quantization)
    if is_fresh(out, digest):
        return out
    from nmt.decode.ct2_spec import check_representable  # CTranslate2's converter imports PyTorch

    check_representable(src.config.model)
    if out.exists() and not (out / MANIFEST).is_file():
        raise NmtError(f"{out}: exists and is not an nmt export; choose another --output")
    try:
        return _write_export(src, out, quantization, digest)
    except OSError as e:
        hint = "nmt export --output DIR, then --checkpoint DIR"
        raise NmtError(f"{out}: cannot write ({e.strerror or e}); {hint}") from None


def fresh_export(run_dir: Path, checkpoint: Path) -> Path | None:
    """The engine's cached float32 export of `checkpoint` when it exists and is current, else None
    (nothing is converted; no PyTorch)."""
    if ctranslate2 is None:
        return None
    src = _resolve_source(run_dir, checkpoint)
    out = default_export_dir(src.run_dir, src.checkpoint, None)
    return out if is_fresh(out, _digest(src, None)) else None


def export_run(opts: ExportOptions) -> Path:
    """The CTranslate2 export directory of a run's checkpoint, written or reused; returns its path.
    (`nmt export` goes through `nmt.decode.export`, which also knows the Argos package.)"""
    require_ctranslate2()
    return ensure_export(_resolve_source(opts.run_dir, opts.checkpoint), opts.output, opts.quantization)


# --------------------------------------------------------------------------- the engine


@dataclass(frozen=True)
class Ct2Device:
    """A device as CTranslate2 names it (PyTorch is not needed to run an export)."""

    type: str  # cpu | cuda
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.type == "cpu" else f"cuda:{self.index}"


def ct2_device(name: str = "auto") -> Ct2Device:
    """'auto' → the first CUDA device CTranslate2 sees, else the CPU; 'cpu', 'cuda', 'cuda:N' checked
    against CTranslate2's own device count (the rule of `nmt.device.resolve_device`)."""
    require_ctranslate2()
    name = (name or "auto").strip().lower()
    gpus = ctranslate2.get_cuda_device_count()
    if name == "auto":
        return Ct2Device("cuda" if gpus else "cpu")
    kind, _, index = name.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()) or (kind == "cpu" and index):
        raise NmtError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N")
    if kind == "cuda" and int(index or 0) >= gpus:
        raise NmtError(f"--device {name!r}: CTranslate2 sees {gpus} CUDA device(s) (use auto or cpu)")
    return Ct2Device(kind, int(index or 0))


def compute_type(device: Ct2Device, precision: str) -> str:
    """CTranslate2 compute type for nmt's `precision`; NmtError when the device cannot run it."""
    require_ctranslate2()
    if precision not in COMPUTE_TYPES:
        raise NmtError(f"--precision {precision!r}: expected one of {' | '.join(COMPUTE_TYPES)}")
    wanted = COMPUTE_TYPES[precision]
    supported = ctranslate2.get_supported_compute_types(device.type)
    if wanted != "default" and wanted not in supported:
        raise NmtError(
            f"--precision {precision}: CTranslate2 on {device.type} supports {' | '.join(sorted(supported))} here"
        )
    return wanted


def seed_sampling(seed: int) -> None:
    """Seed CTranslate2's sampling; effective for engines whose worker threads have not sampled yet."""
    require_ctranslate2()
    ctranslate2.set_random_seed(seed)


_NMT_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class CTranslate2Engine:
    """An exported model run by `ctranslate2.Translator`, with the engine interface of nmt/decode/engines.py."""

    name = "ctranslate2"

    def __init__(
        self, model_dir: Path, decode: DecodeConfig, device: Ct2Device, precision: str, threads: int = 0
    ) -> None:
        """`threads`: CPU threads, fixed at load (0: `nmt.decode.options.cpu_threads`)."""
        require_ctranslate2()
        manifest = json.loads((Path(model_dir) / MANIFEST).read_text(encoding="utf-8"))
        self.model_dir, self.decode, self.device = Path(model_dir), decode, device
        self.max_positions = int(manifest["config"]["model"]["max_positions"])
        self.threads = cpu_threads(threads) if device.type == "cpu" else 0
        self.translator = ctranslate2.Translator(
            str(model_dir),
            device=device.type,
            device_index=device.index,
            compute_type=compute_type(self.device, precision),
            intra_threads=self.threads,
        )
        used = self.translator.compute_type
        self.precision = _NMT_NAMES.get(used, "int8" if used.startswith("int8") else used)
        self.src_pieces = _pieces(self.model_dir / manifest["source_model"])
        self.tgt_pieces = tgt = _pieces(self.model_dir / manifest["target_model"])
        self.tgt_ids = {piece: i for i, piece in enumerate(tgt)}
        self.eos = tgt[EOS_ID]

    @classmethod
    def from_export(
        cls, model_dir: Path, config: Config | None, device: Ct2Device, precision: str, threads: int = 0
    ) -> tuple:
        """An exported directory (`nmt export`) on its own: (engine, source tokenizer, target
        tokenizer, config). The config is `config` (normalisation, decode settings) with the model
        section of the export's manifest; without `config`, the manifest's whole config."""
        from nmt.data.tokenizer import Tokenizer

        require_ctranslate2()
        model_dir = Path(model_dir)
        if not (model_dir / MANIFEST).is_file():
            raise NmtError(f"{model_dir}: not an nmt export (no {MANIFEST}); make one with `nmt export`")
        manifest = json.loads((model_dir / MANIFEST).read_text(encoding="utf-8"))
        stored = config_from_dict(manifest["config"], source=str(model_dir / MANIFEST))
        config = dataclasses.replace(config or stored, model=stored.model)
        engine = cls(model_dir, config.decode, device, precision, threads)
        tokenizers = Tokenizer(model_dir / manifest["source_model"]), Tokenizer(model_dir / manifest["target_model"])
        return engine, *tokenizers, config

    @classmethod
    def from_checkpoint(
        cls, run_dir: Path, path: Path, config: Config, device: Ct2Device, precision: str, threads: int = 0
    ) -> CTranslate2Engine:
        """Convert `path` of `run_dir` into the run's export cache (reused while fresh) and load it."""
        require_ctranslate2()
        src = _resolve_source(run_dir, path, config)
        return cls(ensure_export(src, None, None), config.decode, device, precision, threads)

    def max_len(self, src_len: int) -> int:
        """nmt's per-sentence output limit (nmt.decode.search.max_lengths) for `src_len` pieces."""
        d = self.decode
        return max(0, min(math.floor(d.max_len_a * src_len + d.max_len_b), self.max_positions - 1))

    def search(
        self,
        seqs: list[list[int]],
        beam: int,
        nbest: int,
        len_penalty: float,
        greedy: bool,
        on_done: Any = None,
        *,
        sampling: Sampling | None = None,
    ) -> list[list[tuple[list[int], float]]]:
        """Per sequence up to `nbest` (target ids, score), best first; score NaN for greedy and
        sampling. (`on_done` is not called: CTranslate2 returns a batch at once.) Sampling maps
        onto CTranslate2's `sampling_topk/topp/temperature`. Its random generators live on its
        worker threads and take the seed of `seed_sampling` when they are first used, so a
        process that seeds before loading the engine (`Translator.from_run` does) draws the same
        samples for the same calls as any other such process; within a process each call draws
        on, and unlike the native engine a sentence's sample depends on its batch."""
        if sampling is not None:
            return self._sample(seqs, sampling)
        found: list[list[tuple[list[int], float]]] = [[] for _ in seqs]
        limits = [self.max_len(len(s)) for s in seqs]
        order = sorted(range(len(seqs)), key=lambda i: limits[i])
        for limit, group in groupby(order, key=lambda i: limits[i]):
            rows = list(group)
            sources = [[self.src_pieces[t] for t in seqs[i]] for i in rows]
            if greedy:
                for i, result in zip(rows, self._translate(sources, limit, 1, len_penalty, True), strict=True):
                    found[i] = [(self._ids(result.hypotheses[0])[:limit], math.nan)]
                continue
            for i, source, result in zip(rows, sources, self._beam(sources, limit, beam, len_penalty), strict=True):
                found[i] = self._rank(source, result, limit, len_penalty)[:nbest]
        return found

    def _sample(self, seqs: list[list[int]], sampling: Sampling) -> list[list[tuple[list[int], float]]]:
        limits = [self.max_len(len(s)) for s in seqs]
        results = self.translator.translate_batch(
            [[self.src_pieces[t] for t in s] for s in seqs],
            beam_size=1,
            max_decoding_length=max([*limits, 1]),
            min_decoding_length=self.decode.min_len,
            return_end_token=True,
            max_input_length=0,
            sampling_topk=sampling.topk,  # 0: the whole distribution, as in nmt
            sampling_topp=sampling.topp,
            sampling_temperature=sampling.temperature,
        )
        return [[(self._ids(r.hypotheses[0])[:limit], math.nan)] for r, limit in zip(results, limits, strict=True)]

    def _beam(self, sources: list[list[str]], limit: int, beam: int, len_penalty: float) -> list:
        """Beam search results holding every finished hypothesis nmt would weigh (see `_translate`)."""
        results = self._translate(sources, limit, beam, len_penalty, False)
        again = [j for j, r in enumerate(results) if any(h[-1:] != [self.eos] for h in r.hypotheses)]
        if again:  # these reached the limit: decode them again, keeping all their finished hypotheses
            more = self._translate([sources[j] for j in again], limit, beam, len_penalty, False, patience=2)
            for j, result in zip(again, more, strict=True):
                results[j] = result
        return results

    def _translate(
        self, sources: list[list[str]], limit: int, beam: int, len_penalty: float, greedy: bool, patience: int = 1
    ) -> list:
        """One `translate_batch` call returning `beam * patience` finished hypotheses (for `_rank`).

        patience 2 does not change the search of a sentence that reaches its limit with fewer
        than `beam` finished hypotheses (it runs to the limit either way), but returns all of
        them: with patience 1, CTranslate2 keeps only the `beam` best by its own scores, where
        the hypotheses cut at the limit lack the log-probability of nmt's forced EOS.
        """
        d = self.decode
        return self.translator.translate_batch(
            sources,
            beam_size=1 if greedy else beam,
            patience=patience,
            num_hypotheses=1 if greedy else beam * patience,
            length_penalty=len_penalty,
            max_decoding_length=max(limit, 1),  # 1: CTranslate2 needs a step; cut back by `search`
            min_decoding_length=d.min_len,
            no_repeat_ngram_size=0 if greedy else d.no_repeat_ngram,
            return_end_token=True,
            return_scores=not greedy,
            max_input_length=0,
        )

    def _ids(self, pieces: list[str]) -> list[int]:
        """Target ids of a hypothesis, without its EOS."""
        if pieces and pieces[-1] == self.eos:
            pieces = pieces[:-1]
        return [self.tgt_ids[p] for p in pieces]

    def _rank(self, source: list[str], result: Any, limit: int, len_penalty: float) -> list[tuple[list[int], float]]:
        """nmt's ranking of CTranslate2's finished hypotheses, best first, without duplicates.

        A hypothesis that ran into the length limit has no EOS here, while nmt closes it with
        one: its score is recomputed as (log p(tokens) + log p(EOS)) / (limit + 1) ** len_penalty.
        """
        ranked, cut = [], []
        for pieces, score in zip(result.hypotheses, result.scores, strict=True):
            ids = self._ids(pieces)
            if pieces and pieces[-1] == self.eos:
                ranked.append((ids, float(score)))
            else:
                cut.append(ids[:limit])
        if cut:
            rescored = self.translator.score_batch([source] * len(cut), [[self.tgt_pieces[t] for t in c] for c in cut])
            for ids, r in zip(cut, rescored, strict=True):
                ranked.append((ids, sum(r.log_probs) / float(limit + 1) ** len_penalty))
        ranked.sort(key=lambda h: -h[1])
        best: dict[tuple[int, ...], float] = {}  # first = best score of each token sequence
        for ids, score in ranked:
            best.setdefault(tuple(ids), score)
        unique = [(list(ids), score) for ids, score in best.items()]
        return [h for h in unique if PAD_ID not in h[0] and BOS_ID not in h[0]] or unique  # nmt never emits them
