"""Tiny synthetic training runs for the schedule and regulariser tests: a reverse-the-sequence task
written straight to ``<run>/bin`` (no vocabulary), a small model on one thread, and a fake clock."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nmt.config import Config, load_config
from nmt.data.encoded import write_split
from nmt.run.layout import RunDir
from nmt.train.update import StepResult

ROOT = Path(__file__).resolve().parents[2]
TOY = [
    "vocab.src_size=20", "vocab.tgt_size=20", "model.d_model=32", "model.heads=2", "model.encoder_layers=1",
    "model.decoder_layers=1", "model.ffn_dim=64", "model.dropout=0.2", "train.threads=1", "train.max_tokens=200",
    "train.warmup=4", "train.eval_every=6", "train.eval_sentences=8", "train.keep_last=10", "train.log_every=3",
]  # fmt: skip


def toy_config(*overrides: str) -> Config:
    """configs/tiny.yaml made smaller, with `overrides` (section.key=value) on top."""
    return load_config(ROOT / "configs" / "tiny.yaml", [*TOY, *overrides])


def toy_run(run: Path, n_train: int = 150, n_valid: int = 16, vocab: int = 20) -> Path:
    """<run>/bin/{train,valid}, one shard each in corpus order: random ids 4..vocab-1, target =
    reversed source."""
    rng = np.random.default_rng(123)
    for split, n in (("train", n_train), ("valid", n_valid)):
        srcs = [rng.integers(4, vocab, rng.integers(2, 9)) for _ in range(n)]
        sides = {
            lang: [(np.concatenate(seqs).astype(np.int32), np.array([len(s) for s in seqs]))]
            for lang, seqs in (("zh", srcs), ("en", [s[::-1] for s in srcs]))
        }
        write_split(RunDir(run).bin, split, sides, {"zh": vocab, "en": vocab})
    return run


class Steps:
    """`fit`'s on_step hook: every settled update, in order."""

    def __init__(self) -> None:
        self.results: list[StepResult] = []

    def __call__(self, r: StepResult) -> None:
        self.results.append(r)

    @property
    def lrs(self) -> list[float]:
        return [r.lr for r in self.results]

    @property
    def losses(self) -> list[float]:
        return [r.loss for r in self.results if not r.skipped]
