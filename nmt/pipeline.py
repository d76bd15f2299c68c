"""The one-command pipeline: download → vocab → train → average → select → eval → export.

Each stage is skipped when its stamp says it already ran on the same inputs, so a second
`nmt pipeline` run (or one after an interruption) only does what is left.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nmt.config import Config, config_to_dict, stamp_sections
from nmt.errors import NmtError
from nmt.files import atomic_write_text
from nmt.run.layout import RunDir
from nmt.run.stamps import hash_files, stage_is_done, write_stamp

T = TypeVar("T")


def run_pipeline(config: Config, run_dir: Path, mirror: str | None = None) -> dict:
    """Run every stage on `run_dir`; return {"stages": {stage: "ran"|"skipped"}, "eval": report}."""
    from nmt.train.preflight import check_host

    check_host(config)
    stages = prepare_data(config, run_dir, mirror)
    _log_stage("train")
    stages["train"] = train_stage(config, run_dir)
    _log_stage("select")
    stages["select"] = _after_training(run_dir, "select", lambda: select_stage(config, run_dir))
    _log_stage("eval")
    stages["eval"], report = _after_training(run_dir, "eval", lambda: eval_stage(config, run_dir))
    _log_stage("export")
    stages["export"] = _after_training(run_dir, "export", lambda: export_stage(run_dir))
    return {"stages": stages, "eval": report}


def prepare_data(
    config: Config, run_dir: Path, mirror: str | None = None, *, keep_corpus: bool = False
) -> dict[str, str]:
    """The stages before training, each skipped when its stamp is fresh: download (the cleaned
    corpus) and vocab (the vocabularies, or train.init_from's copied, and the encoded corpus);
    returns {stage: "ran"|"skipped"}. `keep_corpus`: a corpus the run already has is used as it
    is (`nmt train` on a run prepared from a mirror it is not told about again)."""
    from nmt.data.corpus import prepare_corpus
    from nmt.data.vocab import build_vocab

    stages: dict[str, str] = {}
    _log_stage("download")
    if keep_corpus and RunDir(run_dir).stamp("download").is_file():
        stages["download"] = "skipped"
    else:
        stages["download"] = _ran(run_dir, "download", lambda: prepare_corpus(config, run_dir, mirror=mirror))
    _log_stage("vocab")
    stages["vocab"] = _ran(run_dir, "vocab", lambda: build_vocab(config, run_dir))
    return stages


def prepare_and_train(config: Config, run_dir: Path, *, restart: bool = False, mirror: str | None = None) -> dict:
    """`nmt train`: check what the host must run, prepare what is missing, then train (or resume).
    Without `mirror`, a corpus the run already has is kept (the pipeline that made it may have read a
    mirror); the vocabularies and encoding are brought up to date with the config.
    Under torchrun only rank 0 prepares (the run directory must be on storage every rank sees);
    the other ranks wait for it (`_wait_for_rank_0`). Returns the training summary (empty on
    ranks other than 0)."""
    from nmt.train.distributed import env_info
    from nmt.train.loop import train
    from nmt.train.preflight import check_host
    from nmt.train.resume import check_init

    check_host(config)
    if config.train.init_from:
        check_init(config)  # direction and shape, before copying vocabularies and encoding
    marker = RunDir(run_dir).prepared_marker(os.environ.get("TORCHELASTIC_RUN_ID", "none"))
    if env_info().is_main:
        prepare_data(config, run_dir, mirror, keep_corpus=mirror is None)
        if env_info().world_size > 1:
            marker.touch()
    else:
        _wait_for_rank_0(marker)
    _log_stage("train")
    return train(config, run_dir, restart=restart)


def _wait_for_rank_0(marker: Path, poll: float = 2.0) -> None:
    """Block until rank 0 has prepared the data (it touches `marker`, named after torchrun's run
    id, so a marker of an earlier launch does not count); no timeout: preparing WMT takes long."""
    while not marker.exists():
        time.sleep(poll)


def _after_training(run_dir: Path, stage: str, fn: Callable[[], T]) -> T:
    """Run a stage that follows training; if it fails, the trained run stays as it is and the
    error is one line naming the command that finishes the rest (the traceback goes to
    `<run>/pipeline-error.log`, for a bug report), never a traceback that hides 20 minutes of work."""
    try:
        return fn()
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 — reported in one line; the details are in the log
        log = RunDir(run_dir).pipeline_error_log
        with contextlib.suppress(OSError):
            atomic_write_text(log, traceback.format_exc())
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        details = "" if isinstance(e, NmtError) else f" (traceback in {log})"
        raise NmtError(
            f"pipeline stage {stage!r} failed: {reason}{details}. Training is finished and kept in {run_dir}; "
            f"once fixed, `nmt pipeline --run {run_dir}` does the rest (finished stages are skipped)"
        ) from None


def _log_stage(name: str) -> None:
    from rich.console import Console

    Console(stderr=True).rule(f"[bold]{name}")


def _ran(run_dir: Path, stage: str, fn) -> str:
    """Call a stage that stamps itself; report whether it did work (its stamp changed)."""
    stamp = RunDir(run_dir).stamp(stage)
    before = stamp.read_text(encoding="utf-8") if stamp.is_file() else None
    fn()
    after = stamp.read_text(encoding="utf-8") if stamp.is_file() else None
    return "skipped" if before is not None and before == after else "ran"


def _train_digest(config: Config, run_dir: Path) -> str:
    from nmt.data.encoded import encoded_files

    bins = encoded_files(run_dir, "train")
    sections = stamp_sections(config)
    return hash_files(bins, {"model": sections["model"], "train": sections["train"]})


def train_stage(config: Config, run_dir: Path) -> str:
    """Train unless a finished training run with the same inputs is stamped."""
    from nmt.train.loop import train

    digest = _train_digest(config, run_dir)
    if stage_is_done(run_dir, "train", digest):
        return "skipped"
    # A stamp with other inputs means the data or the model changed after a finished run:
    # its checkpoints belong to the old inputs, so start over. No stamp: resume.
    summary = train(config, run_dir, restart=RunDir(run_dir).stamp("train").is_file())
    write_stamp(run_dir, "train", digest, {"summary": _plain(summary)})
    return "ran"


def select_stage(config: Config, run_dir: Path) -> str:
    """Average the last checkpoints, then keep the better of (averaged, best) on validation.

    The choice is made on the validation split only; the winner is copied to
    `checkpoints/final.safetensors` with the step it was chosen after, which translate/eval
    use by default until training goes on (`nmt.run.checkpoints.choose_inference_checkpoint`).
    """
    from nmt.decode.evaluate import EvalJob, evaluate_run
    from nmt.decode.options import InferenceOptions
    from nmt.run.weights import average_last, write_final

    run = RunDir(run_dir)
    trained = sorted(run.checkpoints.glob("step_*.safetensors")) + [p for p in [run.best] if p.is_file()]
    digest = hash_files(trained, "select")
    if run.final.is_file() and stage_is_done(run_dir, "select", digest):
        return "skipped"
    candidates = {"averaged": average_last(run_dir, config.train.keep_last, run.averaged).path}
    if run.best.is_file():
        candidates["best"] = run.best
    scores = {}
    for name, path in candidates.items():
        job = EvalJob(split="valid", name=f"select-{name}")
        report = evaluate_run(config, run_dir, job, InferenceOptions(run_dir=run_dir, checkpoint=path))
        scores[name] = report["bleu"]
    winner = max(scores, key=lambda k: scores[k])
    write_final(run.checkpoints, candidates[winner], winner)
    write_stamp(run_dir, "select", digest, {"valid_bleu": scores, "chosen": winner})
    return "ran"


def eval_stage(config: Config, run_dir: Path) -> tuple[str, dict]:
    """Evaluate the final checkpoint on the test split and on each set of `data.eval_sets` (once
    per final checkpoint); return the test report, with the other sets' under "eval_sets"."""
    import json

    from nmt.config import eval_set_name
    from nmt.decode.evaluate import EvalJob, evaluate_sets
    from nmt.decode.options import InferenceOptions

    run = RunDir(run_dir)
    final = run.final
    names = [eval_set_name(e) for e in config.data.eval_sets]
    digest = hash_files([final], {"decode": config_to_dict(config)["decode"]} | ({"sets": names} if names else {}))
    paths = [run.eval_report(name) for name in ("test", *names)]
    if stage_is_done(run_dir, "eval", digest) and all(p.is_file() for p in paths):
        reports = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
        return "skipped", _with_sets(reports, names)
    src, tgt = config.data.src_lang, config.data.tgt_lang
    jobs = [EvalJob(split="test", name="test")]
    jobs += [EvalJob(src=run.corpus_file(n, src), ref=run.corpus_file(n, tgt), name=n) for n in names]
    reports = evaluate_sets(config, run_dir, jobs, InferenceOptions(run_dir=run_dir, checkpoint=final))
    write_stamp(run_dir, "eval", digest)
    return "ran", _with_sets(reports, names)


def _with_sets(reports: list[dict], names: list[str]) -> dict:
    """The test report, the reports of `data.eval_sets` (`names`) under "eval_sets"."""
    return reports[0] | ({"eval_sets": dict(zip(names, reports[1:], strict=True))} if names else {})


def export_stage(run_dir: Path) -> str:
    """The CTranslate2 export of the final checkpoint (reused while current), so that `nmt
    translate` (`--engine auto`) starts without PyTorch; skipped without the ctranslate2 package
    or for a model CTranslate2 cannot express (the reason is printed)."""
    from nmt.export.ct2_model import ExportOptions, export_run, fresh_export, installed

    final = RunDir(run_dir).final
    if not installed() or fresh_export(run_dir, final) is not None:
        return "skipped"
    try:
        export_run(ExportOptions(run_dir, checkpoint=final))
    except NmtError as e:
        print(f"export skipped: {e}", file=sys.stderr)
        return "skipped"
    return "ran"


def _plain(obj):
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (int, float, str, bool)) or obj is None:
        return obj
    return str(obj)
