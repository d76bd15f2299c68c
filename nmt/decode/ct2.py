"""CTranslate2, part 2: an exported model (`nmt.export.ct2_model`) decoding as one of nmt's engines.

Optional extra (`pip install 'nmt[ctranslate2]'`): this module imports without the package, and
every entry point raises a one-line `NmtError` naming the extra when it is missing.

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
- no_repeat_ngram → no_repeat_ngram_size (both look at the generated tokens, BOS excluded), in
  beam search, greedy search and sampling alike. Greedy outputs are the same; in beam search
  CTranslate2 blocks before its log-softmax (see Masking), so its scores and some rankings differ.
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
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

from nmt import BOS_ID, EOS_ID, PAD_ID
from nmt.config import Config, DecodeConfig, config_from_dict
from nmt.decode.options import Sampling
from nmt.errors import NmtError
from nmt.export.ct2_model import MANIFEST, ensure_export, require_ctranslate2, resolve_source, vocabulary_pieces
from nmt.hw.cores import cpu_threads

# nmt precision → CTranslate2 compute type ("default": the type the weights were saved in)
COMPUTE_TYPES = {"auto": "default", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8"}


@dataclass(frozen=True)
class Ct2Device:
    """A device as CTranslate2 names it (PyTorch is not needed to run an export)."""

    type: str  # cpu | cuda
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.type == "cpu" else f"cuda:{self.index}"


def ct2_device(name: str = "auto") -> Ct2Device:
    """'auto' → the first CUDA device CTranslate2 sees, else the CPU; 'cpu', 'cuda', 'cuda:N' checked
    against CTranslate2's own device count (the rule of `nmt.hw.device.resolve_device`)."""
    lib = require_ctranslate2()
    name = (name or "auto").strip().lower()
    gpus = lib.get_cuda_device_count()
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
    lib = require_ctranslate2()
    if precision not in COMPUTE_TYPES:
        raise NmtError(f"--precision {precision!r}: expected one of {' | '.join(COMPUTE_TYPES)}")
    wanted = COMPUTE_TYPES[precision]
    supported = lib.get_supported_compute_types(device.type)
    if wanted != "default" and wanted not in supported:
        raise NmtError(
            f"--precision {precision}: CTranslate2 on {device.type} supports {' | '.join(sorted(supported))} here"
        )
    return wanted


def seed_sampling(seed: int) -> None:
    """Seed CTranslate2's sampling; effective for engines whose worker threads have not sampled yet."""
    require_ctranslate2().set_random_seed(seed)


_NMT_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class CTranslate2Engine:
    """An exported model run by `ctranslate2.Translator`, with the engine interface of nmt/decode/engines.py."""

    name = "ctranslate2"

    def __init__(
        self, model_dir: Path, decode: DecodeConfig, device: Ct2Device, precision: str, threads: int = 0
    ) -> None:
        """`threads`: CPU threads, fixed at load (0: `nmt.hw.cores.cpu_threads`)."""
        lib = require_ctranslate2()
        manifest = json.loads((Path(model_dir) / MANIFEST).read_text(encoding="utf-8"))
        self.model_dir, self.decode, self.device = Path(model_dir), decode, device
        self.max_positions = int(manifest["config"]["model"]["max_positions"])
        self.threads = cpu_threads(threads) if device.type == "cpu" else 0
        self.translator = lib.Translator(
            str(model_dir),
            device=device.type,
            device_index=device.index,
            compute_type=compute_type(self.device, precision),
            intra_threads=self.threads,
        )
        used = self.translator.compute_type
        self.precision = _NMT_NAMES.get(used, "int8" if used.startswith("int8") else used)
        self.src_pieces = vocabulary_pieces(self.model_dir / manifest["source_model"])
        self.tgt_pieces = tgt = vocabulary_pieces(self.model_dir / manifest["target_model"])
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
        src = resolve_source(run_dir, path, config)
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
            no_repeat_ngram_size=self.decode.no_repeat_ngram,
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
            no_repeat_ngram_size=d.no_repeat_ngram,
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
