"""Validation during training: loss/perplexity on the validation split, greedy BLEU/chrF, and
what training does at each evaluation point (`EvalHook`: validate, keep the best model, write
the step checkpoint).

The loss covers every validation pair the model can take: pairs longer than
``train.max_len`` (a limit for training batches) are included; only pairs with a side
longer than ``model.max_positions - 1`` pieces cannot be scored, and those are counted
(``skipped`` in the result; train.log says so). Like training, a model that `PacksLogits` computes
logits at the real target positions only (the ``keep`` path, packed (N, V)).

BLEU and chrF come from greedy decoding of a fixed (seeded) subset of ``train.eval_sentences``
validation sentences, detokenised with the target tokenizer and scored with
``nmt.decode.evaluate.score`` against the raw references in ``<run>/corpus/valid.en``;
pass-through placeholders that ``nmt vocab`` put into the valid sources are restored first.
Runs without a vocabulary (synthetic tasks written straight to ``<run>/bin``) score the id sequences,
joined by spaces, against the reference ids.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from nmt import PAD_ID
from nmt.batches.batching import TokenBatchSampler, load_batch, pad_sources
from nmt.config import Config
from nmt.contracts import PacksLogits
from nmt.data.passthrough import Masked, mask_pair, masker, restore
from nmt.hw.device import autocast
from nmt.model.wrappers import unwrap
from nmt.run import weights as ckpt
from nmt.run.layout import RunDir
from nmt.run.log import format_values
from nmt.train.objective import label_smoothed_nll
from nmt.train.progress import TrainLog
from nmt.train.update import Trainer

DECODE_BATCH = 64


class Validator:
    def __init__(
        self,
        config: Config,
        run_dir: Path,
        dataset: Any,
        device: torch.device,
        tgt_tokenizer: Any = None,
        *,
        precision: str,
    ) -> None:
        """`precision`: training's, resolved (`nmt.hw.device.training_precision`)."""
        self.config, self.dataset, self.device, self.tokenizer = config, dataset, device, tgt_tokenizer
        self.precision = precision
        t, longest = config.train, config.model.max_positions - 1  # + BOS/EOS = max_positions
        # every pair up to the model's length limit, even if longer than train.max_len
        budget = max(t.max_tokens, longest + 1)
        lengths = dataset.src_lengths, dataset.tgt_lengths
        self.sampler = TokenBatchSampler(*lengths, budget, longest, seed=t.seed, shuffle=False)
        n = min(t.eval_sentences, len(dataset))
        self.subset = np.sort(np.random.default_rng(t.seed).choice(len(dataset), size=n, replace=False))
        self.masks: list[Masked] = []  # pass-through masks of the subset's sources (set by _texts)
        self.sources, self.refs = self._texts(Path(run_dir))

    def _texts(self, run_dir: Path) -> tuple[list[str], list[str]]:
        lang_src, lang_tgt = self.config.data.src_lang, self.config.data.tgt_lang
        run = RunDir(run_dir)
        src_file, ref_file = run.corpus_file("valid", lang_src), run.corpus_file("valid", lang_tgt)
        self.use_text = self.tokenizer is not None and ref_file.is_file()
        if self.use_text:
            refs = ref_file.read_text(encoding="utf-8").split("\n")
            srcs = src_file.read_text(encoding="utf-8").split("\n") if src_file.is_file() else refs
            srcs, refs = [srcs[i] for i in self.subset], [refs[i] for i in self.subset]
            self.masks = _pair_masks(self.config, self.tokenizer, srcs, refs)
            return srcs, refs
        pairs = [self.dataset.pair(int(i)) for i in self.subset]
        return [_ids_text(s) for s, _ in pairs], [_ids_text(t) for _, t in pairs]

    def detok(self, ids: list[int], k: int = -1) -> str:
        """Text of subset sentence k's output ids (pass-through placeholders restored)."""
        if not self.use_text:
            return _ids_text(ids)
        text = self.tokenizer.decode(ids)
        return restore(text, self.masks[k]) if self.masks and k >= 0 else text

    @property
    def pairs(self) -> int:
        """Validation pairs the loss covers (all but `skipped`)."""
        return self.sampler.kept

    @property
    def skipped(self) -> int:
        """Pairs with a side longer than model.max_positions - 1 pieces (not in the loss)."""
        return self.sampler.skipped

    @torch.no_grad()
    def loss(self, model: nn.Module) -> tuple[float, float]:
        """(label-smoothed loss, NLL) per target token over every pair but the `skipped` ones."""
        model.eval()
        packed = isinstance(unwrap(model), PacksLogits)  # logits at real target positions only
        # the host-side packing of each batch: a flash backend never waits for the device (nmt.model.masks.Packing)
        extra = {"packing"} & set(inspect.signature(unwrap(model).forward).parameters)
        total = torch.zeros(3, dtype=torch.float64)
        for idx in self.sampler.iter_epoch(0):
            batch = load_batch(self.dataset, idx).to(self.device)
            src, tgt_in, tgt_out = batch.src, batch.tgt_in, batch.tgt_out
            keep = tgt_out != PAD_ID  # (B, T)
            kw = {"packing": batch.packing} if extra else {}
            with autocast(self.device, self.precision):
                logits = model(src, tgt_in, keep, **kw) if packed else model(src, tgt_in, **kw)  # (N, V) | (B, T, V)
            target = tgt_out[keep] if packed else tgt_out
            loss, nll, n = label_smoothed_nll(logits, target, self.config.train.label_smoothing)
            total += torch.tensor([loss.item(), nll.item(), n], dtype=torch.float64)
        n = max(total[2].item(), 1.0)
        return total[0].item() / n, total[1].item() / n

    @torch.no_grad()
    def translate(self, model: nn.Module) -> list[str]:
        """Greedy translations of the fixed subset, in subset order."""
        from nmt.decode.search import greedy_search

        model.eval()
        d, max_len = self.config.decode, self.config.train.max_len
        srcs = [self.dataset.pair(int(i))[0][:max_len] for i in self.subset]
        order = np.argsort([len(s) for s in srcs], kind="stable")
        hyps: list[str] = [""] * len(srcs)
        for start in range(0, len(order), DECODE_BATCH):
            chunk = order[start : start + DECODE_BATCH]
            src = pad_sources([srcs[i] for i in chunk]).to(self.device)
            with autocast(self.device, self.precision):
                out = greedy_search(model, src, max_len_a=d.max_len_a, max_len_b=d.max_len_b, min_len=d.min_len)
            for i, ids in zip(chunk, out, strict=True):
                hyps[i] = self.detok(ids, int(i))
        return hyps

    def run(self, model: nn.Module) -> dict:
        """Loss, perplexity, BLEU, chrF, three sample translations, pairs in the loss and pairs skipped."""
        from nmt.decode.evaluate import score, scoring_references

        loss, nll = self.loss(model)
        hyps = self.translate(model)
        refs, _ = scoring_references(self.refs, self.config.data)
        scores = score(hyps, refs, tgt_lang=self.config.data.tgt_lang)
        picks = np.linspace(0, len(hyps) - 1, num=min(3, len(hyps))).astype(int)
        samples = [(self.sources[i], hyps[i], self.refs[i]) for i in picks]
        ppl = math.exp(min(nll, 50.0))
        return {
            "loss": loss, "ppl": ppl, "bleu": scores["bleu"], "chrf": scores["chrf"], "samples": samples,
            "pairs": self.pairs, "skipped": self.skipped,
        }  # fmt: skip


def _pair_masks(config: Config, tokenizer: Any, srcs: list[str], refs: list[str]) -> list[Masked]:
    """The masks `nmt vocab` put into the valid split's sources (none without pass-through)."""
    from nmt.data.normalize import normalize_source, normalize_target

    detector, data = masker(config.data, tokenizer), config.data
    if detector is None:
        return []
    return [
        mask_pair(normalize_source(s, data), normalize_target(r, data), detector)[0]
        for s, r in zip(srcs, refs, strict=True)
    ]


def _ids_text(ids: Any) -> str:
    return " ".join(str(int(i)) for i in ids)


# --------------------------------------------------------------------------- at each evaluation point


class EvalHook:
    """Validation + best model + step checkpoint for one training run.

    Every `train.eval_every` updates (and once when training stops) rank 0 runs the `Validator`
    (on the moving average of the weights with ``train.ema_decay``, `nmt.train.ema`),
    writes `best.safetensors` when validation BLEU improved, logs the scores and three samples,
    and writes the step checkpoint (trainer state, then weights; see `nmt.run.weights`). The other
    ranks only record that the step was evaluated."""

    def __init__(
        self, config: Config, ckpt_dir: Path, validator: Validator | None, log: TrainLog, world_size: int
    ) -> None:
        self.config, self.ckpt_dir, self.validator, self.log = config, ckpt_dir, validator, log
        self.world_size = world_size
        self.last: dict = {}  # the newest validation result (rank 0)

    def due(self, step: int, last_eval_step: int) -> bool:
        """On schedule: every `train.eval_every` updates, once per step."""
        return step > 0 and step % self.config.train.eval_every == 0 and last_eval_step != step

    def __call__(self, model: nn.Module, trainer: Trainer, tick: Callable[[], None]) -> None:
        """Evaluate `model` at the trainer's step and checkpoint; `tick` updates the elapsed clock."""
        s = trainer.state
        s.last_eval_step = s.step
        if self.validator is None:  # not rank 0
            return
        with trainer.ema.swapped() if trainer.ema is not None else contextlib.nullcontext():  # train.ema_decay
            result = self.validator.run(model)
            if result["bleu"] > s.best_bleu:
                s.best_bleu, s.best_step, s.bad_evals = result["bleu"], s.step, 0
                ckpt.save_best(self.ckpt_dir, model, self.config, s.step, result["bleu"])
            else:
                s.bad_evals += 1
            self.last = result
            self._log(result, s.step, s.best_bleu, s.best_step)
            tick()
            state = {**trainer.state_dict(), "world_size": self.world_size}
            ckpt.save_checkpoint(self.ckpt_dir, s.step, model, state, self.config, self.config.train.keep_last)

    def _log(self, result: dict, step: int, best_bleu: float, best_step: int) -> None:
        values = {k: result[k] for k in ("loss", "ppl", "bleu", "chrf")}
        self.log.scalars("valid", values, step)
        self.log.line(f"valid step {step} | {format_values(values)} | best bleu {best_bleu:.2f} @ {best_step}")
        if result.get("skipped"):
            self.log.line(f"  valid loss over {result['pairs']} pairs; {result['skipped']} skipped (too long)")
        for i, (src, hyp, ref) in enumerate(result["samples"]):
            self.log.line(f"  sample {i + 1}: src: {src}\n            hyp: {hyp}\n            ref: {ref}")
            self.log.text(f"samples/{i + 1}", f"src: {src}  \nhyp: {hyp}  \nref: {ref}", step)
