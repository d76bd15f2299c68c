"""What a command decodes with, as plain settings (no PyTorch): which model of a run, on which
engine, device and precision, and how it searches (`InferenceOptions`) or samples (`Sampling`).

One object for every way in (CLI, server, scripts); `nmt.decode.translator.Translator.from_options`
turns it into a working translator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from nmt.errors import NmtError

ENGINES = ("native", "ctranslate2", "auto")  # auto: `nmt.decode.loading.choose`
DEFAULT_ENGINE = "auto"  # what every command that decodes (translate, eval, serve, backtranslate) defaults to
REFERENCE_PRECISION = "fp32"  # what `--precision auto` decodes in, on either engine (`nmt.decode.loading.choose`)
BATCH_ROWS = 64  # rows of a decoding step in batches (eval, backtranslate, translate --input, serve)
ALONE_ROWS = 1  # a sentence at a time (translate of arguments, serve --tune-for sentence)


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How to sample: `topk` most probable tokens (0 = the whole distribution), nucleus `topp`
    in (0, 1], `temperature` > 0 (below 1 sharper, above 1 flatter), `seed` for the draws."""

    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.topk < 0:
            raise NmtError(f"--sample-topk {self.topk}: must be >= 0 (0 = the whole distribution)")
        if not (0.0 < self.topp <= 1.0) or math.isnan(self.topp):
            raise NmtError(f"--sample-topp {self.topp}: must be in (0, 1]")
        if not (self.temperature > 0.0 and math.isfinite(self.temperature)):
            raise NmtError(f"--temperature {self.temperature}: must be a finite number > 0")
        if self.seed < 0:
            raise NmtError(f"--seed {self.seed}: must be >= 0")


@dataclass(frozen=True, kw_only=True)
class InferenceOptions:
    """Which model of a run, and how it decodes: one object for translate, eval and serve."""

    run_dir: Path | None = None  # None: the newest run under runs/ with a model (nmt.run.dirs.newest_model_run)
    checkpoint: Path | None = None  # None: the run's inference checkpoint (nmt.run.checkpoints)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto (= REFERENCE_PRECISION) | fp32 | bf16 | int8 (native engine)
    engine: str = "native"  # native | ctranslate2 | auto
    beam: int | None = None  # None: decode.beam of the run's config
    nbest: int = 1
    len_penalty: float | None = None  # None: decode.len_penalty
    sampling: Sampling | None = None  # draw tokens (top-k / top-p / temperature, seeded) instead of searching
    ensemble: tuple[Path, ...] = ()  # more checkpoints decoded with `checkpoint` as one model (native engine)
    threads: int = 0  # CPU threads of the CTranslate2 engine, fixed when it loads (0: `cpu_threads`)
    # mask pass-through spans before the model (nmt's own runtimes); False: raw text in, as exported
    # models get it in Argos, LibreTranslate or transformers (`nmt eval --no-passthrough`)
    passthrough: bool = True
    rows: int = BATCH_ROWS  # rows of a typical decoding step: the native engine's int8 kernel is
    # the one measured fastest for it (`nmt.decode.precision`); ALONE_ROWS for a sentence at a time
