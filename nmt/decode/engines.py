"""Decoding engines: what turns batches of source ids into target ids and scores.

`Translator` (nmt/decode/translator.py) does the text work (normalisation, tokenisation, batching,
detokenisation) and hands each padded batch to an engine. Every engine has the same method:

    search(seqs, beam, nbest, len_penalty, greedy, on_done=None) -> list[list[(tokens, score)]]

`seqs` are source piece ids without EOS; the result holds, per sequence, up to `nbest`
`(target ids without BOS/EOS, score)` pairs, best first (score NaN for greedy). An engine may call
`on_done(i, pairs)` as soon as sequence i is done (the native beam search does; others need not).

- `NativeEngine`: nmt's own PyTorch model and `nmt/decode/search.py`.
- the CTranslate2 engine lives in `nmt/decode/ct2.py` (optional extra `nmt[ctranslate2]`).
"""

from __future__ import annotations

import torch

from nmt.batches.batching import pad_sources
from nmt.config import DecodeConfig
from nmt.contracts import Found, OnDone
from nmt.decode.options import BATCH_ROWS, Sampling
from nmt.decode.precision import decoding_model, model_shape, resolve_inference_precision
from nmt.decode.search import Hypothesis, beam_search, greedy_search
from nmt.model.fast_decoder import fast_decoder


class NativeEngine:
    """nmt's PyTorch model on `device`, decoding in `precision` (auto | fp32 | bf16 | fp16 | int8).

    'auto' is fp32 (`nmt.decode.precision.resolve_inference_precision`); int8 runs on the kernel measured
    fastest here for steps of `rows` rows (64: batches; 1: a sentence at a time); the model is
    converted once (bf16/fp16 weights, int8 linear layers), `self.precision` is the result.
    """

    name = "native"

    def __init__(
        self,
        model: torch.nn.Module,
        decode: DecodeConfig,
        device: torch.device | str,
        precision: str,
        rows: int = BATCH_ROWS,
    ) -> None:
        device = torch.device(device)
        self.precision = resolve_inference_precision(device, precision, model_shape(model), rows)
        self.model = decoding_model(model, device, self.precision, rows)
        self.stepper = fast_decoder(self.model)  # what the searches drive: the same steps, less overhead
        self.decode, self.device = decode, device
        modules = self.model.modules() if isinstance(self.model, torch.nn.Module) else ()
        kernels = {getattr(m, "kernel", "") for m in modules} - {""}  # int8 layers: the kernel they run on
        self.describe = f"native {self.precision}" + (f" ({', '.join(sorted(kernels))})" if kernels else "")

    def search(
        self,
        seqs: list[list[int]],
        beam: int,
        nbest: int,
        len_penalty: float,
        greedy: bool,
        on_done: OnDone = None,
        *,
        sampling: Sampling | None = None,
    ) -> Found:
        d = self.decode
        src = pad_sources(seqs).to(self.device)  # (B, S)
        with torch.inference_mode():
            if greedy or sampling is not None:
                lengths = (d.max_len_a, d.max_len_b, d.min_len)
                out = greedy_search(self.stepper, src, *lengths, sampling=sampling, no_repeat_ngram=d.no_repeat_ngram)
                return [[(tokens, float("nan"))] for tokens in out]
            report = (lambda i, row: on_done(i, _pairs(row))) if on_done is not None else None
            lengths = (d.max_len_a, d.max_len_b, d.min_len, d.no_repeat_ngram)
            hyps = beam_search(self.stepper, src, beam, nbest, len_penalty, *lengths, on_done=report)
        return [_pairs(row) for row in hyps]


def _pairs(hyps: list[Hypothesis]) -> list[tuple[list[int], float]]:
    return [(h.tokens, h.score) for h in hyps]
