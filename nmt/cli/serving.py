"""The commands about serving and the host: the HTTP server, and what this machine runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nmt.cli.options import (
    BeamOpt,
    CheckpointsOpt,
    DeviceOpt,
    EngineOpt,
    LogLevel,
    PrecisionOpt,
    RunOpt,
    TuneFor,
    inference_options,
    user_errors,
)
from nmt.decode.options import ALONE_ROWS, BATCH_ROWS, DEFAULT_ENGINE
from nmt.errors import NmtError


@user_errors
def serve(
    run: RunOpt = None,
    checkpoint: CheckpointsOpt = None,
    beam: BeamOpt = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "auto",
    engine: EngineOpt = DEFAULT_ENGINE,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="0 = any free port.")] = 8080,
    max_sentences: Annotated[int, typer.Option("--max-sentences", min=1, help="Sentences per request.")] = 64,
    max_chars: Annotated[int, typer.Option("--max-chars", min=1, help="Characters per sentence.")] = 2000,
    max_beam: Annotated[int, typer.Option("--max-beam", min=1, help="Largest beam a request may ask for.")] = 16,
    batch_wait_ms: Annotated[float, typer.Option("--batch-wait-ms", min=0, help="Wait for company.")] = 5.0,
    max_batch: Annotated[int, typer.Option("--max-batch", min=1, help="Sentences per model call.")] = 64,
    workers: Annotated[
        int,
        typer.Option(
            "--workers", min=0, help="Batches decoded at once; several run in child processes (0: one per core, <= 4)."
        ),
    ] = 0,
    log_level: Annotated[LogLevel, typer.Option("--log-level", help="warning: no line per request.")] = LogLevel.info,
    api_keys: Annotated[
        Path | None,
        typer.Option("--api-keys", help="File of LibreTranslate API keys, one a line: its requests then need one."),
    ] = None,
    req_limit: Annotated[
        int, typer.Option("--req-limit", min=0, help="LibreTranslate requests per minute per client (0 = no limit).")
    ] = 0,
    tune_for: Annotated[
        TuneFor,
        typer.Option(
            "--tune-for",
            help="Native engine: pick the int8 kernel measured fastest for one sentence at a time (few "
            "clients) or for batches (heavy load).",
        ),
    ] = TuneFor.batch,
) -> None:
    """Serve a run over HTTP: JSON API (/translate, /docs), LibreTranslate API, web page at / (needs nmt[serve])."""
    try:
        from nmt.serve.app import ServeLimits, ServeOptions
        from nmt.serve.app import serve as run_server
        from nmt.serve.libretranslate import LibreAccess
    except ImportError as e:
        raise NmtError(f"nmt serve needs the serve extra ({e.name} is missing): pip install 'nmt[serve]'") from None
    from nmt.serve.batcher import BatchLimits

    batch = BatchLimits(batch_wait_ms, max_batch, workers)
    limits = ServeLimits(max_sentences, max_chars, max_beam=max_beam, batch=batch)
    rows = ALONE_ROWS if tune_for is TuneFor.sentence else BATCH_ROWS
    opts = inference_options(run, checkpoint, device, precision, engine, beam=beam, rows=rows)
    access = LibreAccess.load(api_keys, req_limit)  # before loading the model: a bad file fails at once
    run_server(opts, ServeOptions(host, port, limits, log_level.value, access))


@user_errors
def doctor(
    refresh: Annotated[
        bool, typer.Option("--refresh", help="Drop this machine's cached measurements and measure anew.")
    ] = False,
) -> None:
    """What this machine runs: the CPU, each hardware-dependent kernel (or why not), and the
    decoding precisions it offers with their measured speed, one sentence at a time and in batches."""
    from nmt.decode.precision import describe_host
    from nmt.hw import host

    if refresh:
        typer.echo(f"dropped {host.refresh()} cached measurements of this machine", err=True)
    typer.echo(describe_host())
