"""The commands that build a model: corpus, vocabularies, training, the whole pipeline, checkpoint
averaging, the model's summary and its training curves."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from nmt.cli.options import (
    ConfigOpt,
    MirrorOpt,
    RunOpt,
    SetOpt,
    existing_run,
    format_summary,
    setup_run,
    user_errors,
)


@user_errors
def download(config: ConfigOpt = None, set_: SetOpt = None, run: RunOpt = None, mirror: MirrorOpt = None) -> None:
    """Fetch the configured corpus (hub or local mirror), clean it and write <run>/corpus/."""
    cfg, run_dir = setup_run(config, set_, run)
    from nmt.data.corpus import prepare_corpus

    prepare_corpus(cfg, run_dir, mirror=mirror)


@user_errors
def vocab(config: ConfigOpt = None, set_: SetOpt = None, run: RunOpt = None) -> None:
    """Train the zh and en SentencePiece models and encode every split to <run>/bin/."""
    cfg, run_dir = setup_run(config, set_, run)
    from nmt.data.vocab import build_vocab

    build_vocab(cfg, run_dir)


@user_errors
def train(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    restart: Annotated[bool, typer.Option("--restart", help="Delete checkpoints and start over.")] = False,
    nproc: Annotated[int, typer.Option("--nproc", help="Processes on this machine (DDP via torchrun).")] = 1,
    mirror: MirrorOpt = None,
    init_from: Annotated[
        Path | None,
        typer.Option(
            "--init-from",
            help="Fine-tune: start from this checkpoint's weights (fresh optimizer and steps) and its run's "
            "vocabularies (= --set train.init_from=PATH).",
        ),
    ] = None,
) -> None:
    """Train (or resume) the model of a run, preparing the corpus and vocabularies first where they are
    missing (finished stages are skipped). Resumes from the last checkpoint unless --restart."""
    from nmt.hw.device import bound_kernel_cache

    bound_kernel_cache()  # before any kernel, and inherited by torchrun's processes
    if nproc > 1 and "LOCAL_RANK" not in os.environ:
        from nmt.train.distributed import launch_with_torchrun

        raise typer.Exit(launch_with_torchrun(nproc, sys.argv[1:]))
    set_ = [*(set_ or []), f"train.init_from={init_from}"] if init_from is not None else set_
    cfg, run_dir = setup_run(config, set_, run)
    from nmt.pipeline import prepare_and_train

    summary = prepare_and_train(cfg, run_dir, restart=restart, mirror=mirror)
    if summary:
        typer.echo(format_summary(summary))


@user_errors
def pipeline(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    mirror: MirrorOpt = None,
) -> None:
    """download → vocab → train → average → eval in one command, skipping finished stages."""
    from nmt.hw.device import bound_kernel_cache

    bound_kernel_cache()
    cfg, run_dir = setup_run(config, set_, run)
    from nmt.pipeline import run_pipeline

    run_pipeline(cfg, run_dir, mirror=mirror)


@user_errors
def average(
    run: RunOpt = None,
    last: Annotated[int, typer.Option("--last", "-n", min=1, help="How many of the newest checkpoints.")] = 5,
    output: Annotated[Path | None, typer.Option("--output", "-o")] = None,
) -> None:
    """Average the last N checkpoints of a run into one (usually +0.5-1 BLEU).

    With fewer than N checkpoints kept it averages those and says how many."""
    from nmt.run.weights import average_last

    typer.echo(average_last(existing_run(run), last, output).message())


@user_errors
def summary(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    src_vocab: Annotated[int | None, typer.Option("--src-vocab", help="Default: vocab.src_size.")] = None,
    tgt_vocab: Annotated[int | None, typer.Option("--tgt-vocab", help="Default: vocab.tgt_size.")] = None,
) -> None:
    """Print the model's size, shape and attention backend without training."""
    from nmt.model.transformer import build_model, model_summary

    cfg, _ = setup_run(config, set_, run, create=False)
    model = build_model(cfg, src_vocab or cfg.vocab.src_size, tgt_vocab or cfg.vocab.tgt_size)
    typer.echo(model_summary(model))


@user_errors
def plot(
    run: RunOpt = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Directory (default <run>/plots).")] = None,
    compare: Annotated[
        list[Path] | None,
        typer.Option("--compare", help="Another run drawn on the same axes (repeatable), e.g. ablation arms."),
    ] = None,
) -> None:
    """Write a run's training curves (loss, validation BLEU, lr, tokens/s) as PNG files."""
    from nmt.serve.plot import plot_run

    for path in plot_run(existing_run(run), output, compare or ()):
        typer.echo(f"wrote {path}")
