"""What training does at an evaluation point: validate, track the best model, checkpoint.

Every `train.eval_every` updates (and once when training stops) rank 0 runs the `Validator`,
writes `best.safetensors` when validation BLEU improved, logs the scores and three samples,
and writes the step checkpoint (trainer state, then weights; see `nmt.checkpoint`). The other
ranks only record that the step was evaluated.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

from nmt import checkpoint as ckpt
from nmt.config import Config
from nmt.train.progress import TrainLog, format_values
from nmt.train.update import Trainer
from nmt.train.validation import Validator


class EvalHook:
    """Validation + best model + step checkpoint for one training run."""

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
