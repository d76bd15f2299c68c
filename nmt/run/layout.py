"""The run directory's names: `RunDir(path)` spells every file and folder of a run once.

Every module that reads or writes a run asks a `RunDir` (`RunDir(run_dir).vocab_model("zh")`,
`.eval_report("test")`, `.stamp("train")`) instead of joining names to the run's path itself;
`tests/test_imports.py` holds every module outside `nmt.run`, and every script, to that. What each file holds is
the map in `nmt/run/__init__.py`. The names of a checkpoint folder's files are constants here
too, for the functions that are given that folder rather than the run (`nmt.run.checkpoints`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CONFIG = "config.yaml"
CORPUS, CORPUS_WORK, VOCAB, BIN = "corpus", "corpus.work", "vocab", "bin"
CHECKPOINTS, EXPORT, EVAL, TB_DIR, TRAIN_LOG = "checkpoints", "export", "eval", "tb", "train.log"
FINAL, BEST, AVERAGED = "final.safetensors", "best.safetensors", "averaged.safetensors"
MANIFEST = "manifest.json"  # a corpus's or an encoded split's file list with sizes and sha256
STATS, DATA_CARD = "stats.json", "DATA.md"  # in corpus/
PIPELINE_ERROR_LOG = "pipeline-error.log"


@dataclass(frozen=True)
class RunDir:
    """The files and folders of the run at `path` (nothing is created or checked here)."""

    path: Path

    def __init__(self, path: str | Path) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def config(self) -> Path:
        """config.yaml: the resolved config the run was set up with."""
        return self.path / CONFIG

    @property
    def corpus(self) -> Path:
        return self.path / CORPUS

    def corpus_file(self, split: str, lang: str) -> Path:
        """corpus/<split>.<lang>: one sentence per line (a split, or a test set of data.eval_sets)."""
        return self.corpus / f"{split}.{lang}"

    def corpus_codes(self, split: str) -> Path:
        """corpus/<split>.codes: optional per-line codes of a split (cmn_Hans / cmn_Hant)."""
        return self.corpus / f"{split}.codes"

    @property
    def corpus_stats(self) -> Path:
        return self.corpus / STATS

    @property
    def corpus_manifest(self) -> Path:
        return self.corpus / MANIFEST

    @property
    def data_card(self) -> Path:
        """corpus/DATA.md: the training corpora, their sources and licences."""
        return self.corpus / DATA_CARD

    @property
    def corpus_work(self) -> Path:
        """corpus.work/: cleaned units while the corpus stage runs."""
        return self.path / CORPUS_WORK

    @property
    def vocab(self) -> Path:
        return self.path / VOCAB

    def vocab_model(self, lang: str) -> Path:
        """vocab/<lang>.model: a side's SentencePiece model."""
        return self.vocab / f"{lang}.model"

    def vocab_sample(self, lang: str) -> Path:
        """vocab/sample.<lang>: the lines a side's model trained on."""
        return self.vocab / f"sample.{lang}"

    @property
    def bin(self) -> Path:
        """bin/: the encoded splits."""
        return self.path / BIN

    def encoded_manifest(self, split: str) -> Path:
        """bin/<split>/manifest.json: an encoded split's shards."""
        return self.bin / split / MANIFEST

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def final(self) -> Path:
        """checkpoints/final.safetensors: the model the pipeline chose on validation."""
        return self.checkpoints / FINAL

    @property
    def best(self) -> Path:
        return self.checkpoints / BEST

    @property
    def averaged(self) -> Path:
        return self.checkpoints / AVERAGED

    @property
    def export(self) -> Path:
        """export/: one folder per export of a checkpoint (`nmt.export` names them)."""
        return self.path / EXPORT

    @property
    def tb(self) -> Path:
        """tb/: TensorBoard scalars and texts (`nmt.run.log`)."""
        return self.path / TB_DIR

    @property
    def train_log(self) -> Path:
        return self.path / TRAIN_LOG

    @property
    def eval(self) -> Path:
        return self.path / EVAL

    def eval_file(self, name: str, suffix: str) -> Path:
        """eval/<name>.<suffix>: an evaluation's hypotheses (hyp), report (json) or table (md)."""
        return self.eval / f"{name}.{suffix}"

    def eval_report(self, name: str) -> Path:
        return self.eval_file(name, "json")

    def stamp(self, stage: str) -> Path:
        """<stage>.stamp.json: the hash of a finished stage's inputs (`nmt.run.stamps`)."""
        return self.path / f"{stage}.stamp.json"

    def prepared_marker(self, launch: str) -> Path:
        """.prepared-<launch>: the data a torchrun launch's rank 0 prepared (`nmt.pipeline`)."""
        return self.path / f".prepared-{launch}"

    @property
    def pipeline_error_log(self) -> Path:
        """pipeline-error.log: the traceback of a pipeline stage after training that failed."""
        return self.path / PIPELINE_ERROR_LOG
