"""The `nmt` command line: thin commands that parse, call one library function, print.

Library modules are imported inside each command so that `nmt --help` starts instantly.
A user mistake (`NmtError`) is printed as one line on stderr with exit code 1.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from nmt.decode.options import ALONE_ROWS, BATCH_ROWS
from nmt.errors import NmtError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text is plain: "nmt[serve]" must not be read as markup
    help="Chinese↔English neural machine translation (data.direction zh-en | en-zh): "
    "download → vocab → train → translate/eval.",
)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config; default: the run's saved config.yaml."),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override a config value: section.key=value (repeatable)."),
]
RunOpt = Annotated[
    Path | None,
    typer.Option(
        "--run",
        "-r",
        help="Run directory; default runs/<config name>, else runs/latest (commands that load a model: "
        "the newest run under runs/ with one).",
    ),
]
MirrorOpt = Annotated[
    str | None,
    typer.Option("--mirror", help="Local corpus mirror directory (default: $NMT_MIRROR, then the hub)."),
]

CheckpointOpt = Annotated[
    Path | None, typer.Option("--checkpoint", help="A .safetensors checkpoint (default: the run's newest model).")
]
CheckpointsOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--checkpoint",
        help="A .safetensors checkpoint (default: the run's newest model); more than once: an ensemble "
        "(log-probabilities averaged at every step; native engine, shared vocabularies).",
    ),
]
BeamOpt = Annotated[int | None, typer.Option("--beam", min=1, help="Beam size (1 = greedy; default decode.beam).")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N")]
PrecisionOpt = Annotated[
    str, typer.Option("--precision", help="auto | fp32 | bf16 | int8 (native engine; auto = fastest measured here)")
]
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="native | ctranslate2 (needs nmt[ctranslate2]) | auto (ctranslate2 where the model has a current "
        "export: nmt export, or an earlier --engine ctranslate2; else native)",
    ),
]
TopkOpt = Annotated[
    int | None, typer.Option("--sample-topk", help="Sample from the K most probable tokens (0 = all) instead of beam.")
]
ToppOpt = Annotated[float | None, typer.Option("--sample-topp", help="Sample from the nucleus of mass P in (0, 1].")]
TemperatureOpt = Annotated[float | None, typer.Option("--temperature", help="Sampling temperature > 0 (default 1).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the sampling draws (same seed, same output).")]


class TuneFor(str, enum.Enum):
    """What the native engine's `--precision auto` and int8 kernel are measured for."""

    sentence = "sentence"  # one sentence at a time: `InferenceOptions.rows` = ALONE_ROWS
    batch = "batch"  # batches: BATCH_ROWS


class LogLevel(str, enum.Enum):
    """uvicorn's log levels (`nmt serve --log-level`); info logs a line per request."""

    critical = "critical"
    error = "error"
    warning = "warning"
    info = "info"
    debug = "debug"


F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn `NmtError` into a one-line message and exit code 1 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NmtError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            typer.echo("interrupted: run the same command again to resume", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def _setup(
    config: Path | None, overrides: list[str] | None, run: Path | None, create: bool = True, need_model: bool = False
):
    from nmt.runs import init_run, resolve_run

    cfg, run_dir = resolve_run(str(config) if config else None, str(run) if run else None, overrides, need_model)
    if create:
        init_run(cfg, run_dir)
    return cfg, run_dir


@app.command()
@user_errors
def download(config: ConfigOpt = None, set_: SetOpt = None, run: RunOpt = None, mirror: MirrorOpt = None) -> None:
    """Fetch the configured corpus (hub or local mirror), clean it and write <run>/corpus/."""
    cfg, run_dir = _setup(config, set_, run)
    from nmt.data.corpus import prepare_corpus

    prepare_corpus(cfg, run_dir, mirror=mirror)


@app.command()
@user_errors
def vocab(config: ConfigOpt = None, set_: SetOpt = None, run: RunOpt = None) -> None:
    """Train the zh and en SentencePiece models and encode every split to <run>/bin/."""
    cfg, run_dir = _setup(config, set_, run)
    from nmt.data.vocab import build_vocab

    build_vocab(cfg, run_dir)


@app.command()
@user_errors
def train(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    restart: Annotated[bool, typer.Option("--restart", help="Delete checkpoints and start over.")] = False,
    nproc: Annotated[int, typer.Option("--nproc", help="Processes on this machine (DDP via torchrun).")] = 1,
    init_from: Annotated[
        Path | None,
        typer.Option(
            "--init-from",
            help="Fine-tune: start from this checkpoint's weights (fresh optimizer and steps) and its run's "
            "vocabularies (= --set train.init_from=PATH).",
        ),
    ] = None,
) -> None:
    """Train (or resume) the model of a run. Resumes from the last checkpoint unless --restart."""
    if nproc > 1 and "LOCAL_RANK" not in os.environ:
        from nmt.train.distributed import launch_with_torchrun

        raise typer.Exit(launch_with_torchrun(nproc, sys.argv[1:]))
    set_ = [*(set_ or []), f"train.init_from={init_from}"] if init_from is not None else set_
    cfg, run_dir = _setup(config, set_, run)
    from nmt.train.loop import train as train_run

    if cfg.train.init_from:
        from nmt.data.vocab import build_vocab
        from nmt.train.resume import check_init

        check_init(cfg)  # direction and shape, before copying vocabularies and encoding
        build_vocab(cfg, run_dir)  # copies the source run's vocabularies and encodes with them (once)

    summary = train_run(cfg, run_dir, restart=restart)
    if summary:
        typer.echo(_format_summary(summary))


@app.command()
@user_errors
def translate(
    texts: Annotated[list[str] | None, typer.Argument(help="Sentences to translate (else --input or stdin).")] = None,
    input: Annotated[Path | None, typer.Option("--input", "-i", help="File with one sentence per line.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write translations here.")] = None,
    run: RunOpt = None,
    checkpoint: CheckpointsOpt = None,
    beam: BeamOpt = None,
    nbest: Annotated[int, typer.Option("--nbest", min=1, help="Hypotheses per sentence.")] = 1,
    len_penalty: Annotated[float | None, typer.Option("--len-penalty")] = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "auto",
    engine: EngineOpt = "auto",
    attention: Annotated[
        Path | None, typer.Option("--attention", help="Also write a cross-attention heatmap per sentence: DIR/<n>.png.")
    ] = None,
    sample_topk: TopkOpt = None,
    sample_topp: ToppOpt = None,
    temperature: TemperatureOpt = None,
    seed: SeedOpt = 0,
) -> None:
    """Translate text in the run's source language (data.direction) with a trained run (default:
    the newest run under runs/ with a model).

    With --nbest K > 1 each input gives K lines `score<TAB>text`, best first."""
    from nmt.decode.translator import translate_to

    if texts and input:
        raise NmtError("give sentences as arguments or --input FILE, not both")
    sampling = _sampling(sample_topk, sample_topp, temperature, seed)
    search = {"beam": beam, "nbest": nbest, "len_penalty": len_penalty, "sampling": sampling}
    rows = ALONE_ROWS if texts else BATCH_ROWS  # sentences given as arguments: decoded one at a time
    opts = _inference(run, checkpoint, device, precision, engine, **search, rows=rows)
    if attention is not None:
        from nmt.serve.plot import translate_with_attention

        if engine == "auto":
            opts = dataclasses.replace(opts, engine="native")  # attention weights come from the native model
        if nbest > 1:
            raise NmtError("--attention draws the best translation of each line; drop --nbest")

        n = translate_with_attention(opts, _read_lines(texts, input), attention, output)
        typer.echo(f"wrote {n} heatmaps to {attention}", err=True)
        return
    translate_to(opts, texts=texts, input_path=input, output_path=output)


def _inference(
    run: Path | None, checkpoints: list[Path] | None, device: str, precision: str, engine: str, **more: Any
) -> Any:
    """The `nmt.decode.options.InferenceOptions` of a command's model options (`more`: beam, nbest,
    sampling...). `--checkpoint` given once or more: the first is the model, the rest its ensemble."""
    from nmt.decode.options import InferenceOptions

    models = {"checkpoint": checkpoints[0], "ensemble": tuple(checkpoints[1:])} if checkpoints else {}
    return InferenceOptions(run_dir=run, **models, device=device, precision=precision, engine=engine, **more)


def _sampling(topk: int | None, topp: float | None, temperature: float | None, seed: int) -> Any:
    """A `nmt.decode.sampling.Sampling` when any sampling option is given, else None (beam search)."""
    if topk is None and topp is None and temperature is None:
        return None
    from nmt.decode.options import Sampling

    return Sampling(
        topk=0 if topk is None else topk,
        topp=1.0 if topp is None else topp,
        temperature=1.0 if temperature is None else temperature,
        seed=seed,
    )


def _read_lines(texts: list[str] | None, path: Path | None) -> list[str]:
    """Sentences from the arguments, a file or stdin (invalid UTF-8 becomes U+FFFD)."""
    if texts:
        return list(texts)
    if path is not None and not path.is_file():
        raise NmtError(f"{path}: input file not found")
    data = path.read_bytes() if path is not None else sys.stdin.buffer.read()
    return data.decode("utf-8", errors="replace").splitlines()


@app.command(name="eval")
@user_errors
def eval_(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    split: Annotated[str, typer.Option("--split", help="valid | test")] = "test",
    src: Annotated[
        list[Path] | None, typer.Option("--src", help="External source file (with --ref); repeat for more sets.")
    ] = None,
    ref: Annotated[list[Path] | None, typer.Option("--ref", help="External reference file, one per --src.")] = None,
    name: Annotated[
        list[str] | None, typer.Option("--name", help="Report name per --src set (default: ext-<folder>.<stem>).")
    ] = None,
    checkpoint: CheckpointsOpt = None,
    beam: BeamOpt = None,
    greedy: Annotated[bool, typer.Option("--greedy", help="Also report greedy decoding.")] = False,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "auto",
    engine: EngineOpt = "native",
    sample_topk: TopkOpt = None,
    sample_topp: ToppOpt = None,
    temperature: TemperatureOpt = None,
    seed: SeedOpt = 0,
) -> None:
    """Translate a split (or one or more --src/--ref sets) and score it with sacreBLEU BLEU and chrF."""
    from nmt.decode.evaluate import EvalJob, evaluate_sets

    if split not in ("valid", "test"):
        raise NmtError(f"--split {split!r}: expected valid or test")
    src, ref, name = src or [], ref or [], name or []
    if len(src) != len(ref):
        raise NmtError(f"--src and --ref go together: {len(src)} --src, {len(ref)} --ref")
    if name and len(name) != len(src):
        raise NmtError(f"--name: {len(name)} names for {len(src)} --src sets")
    cfg, run_dir = _setup(config, set_, run, create=False, need_model=True)
    names = name or [None] * len(src)
    jobs = [EvalJob(src=s, ref=r, name=n, greedy=greedy) for s, r, n in zip(src, ref, names, strict=True)]
    evaluate_sets(
        cfg,
        run_dir,
        jobs or [EvalJob(split=split, greedy=greedy)],
        _inference(
            run_dir,
            checkpoint,
            device,
            precision,
            engine,
            beam=beam,
            sampling=_sampling(sample_topk, sample_topp, temperature, seed),
        ),
    )


@app.command()
@user_errors
def average(
    run: RunOpt = None,
    last: Annotated[int, typer.Option("--last", "-n", min=1, help="How many of the newest checkpoints.")] = 5,
    output: Annotated[Path | None, typer.Option("--output", "-o")] = None,
) -> None:
    """Average the last N checkpoints of a run into one (usually +0.5-1 BLEU).

    With fewer than N checkpoints kept it averages those and says how many."""
    from nmt.checkpoint import average_last

    typer.echo(average_last(_run_dir(run), last, output).message())


@app.command()
@user_errors
def export(
    run: RunOpt = None,
    checkpoint: CheckpointOpt = None,
    format_: Annotated[
        str,
        typer.Option(
            "--format", help="ctranslate2 | argos (an .argosmodel for Argos Translate); needs nmt[ctranslate2]"
        ),
    ] = "ctranslate2",
    quantization: Annotated[
        str | None, typer.Option("--quantization", help="int8 | int8_float32 | bfloat16 | float16 (default: float32)")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Default: <run>/export/ct2-... (argos: <run>/export/argos-....argosmodel)"),
    ] = None,
) -> None:
    """Export a run's model for another inference engine: CTranslate2 (with both vocabularies), or an
    Argos Translate package (.argosmodel, for Argos Translate and LibreTranslate)."""
    from nmt.decode.ct2 import ExportOptions
    from nmt.decode.export import export as write_export

    out = write_export(ExportOptions(_run_dir(run), checkpoint, output, quantization, format_))
    typer.echo(f"wrote {out}")


@app.command()
@user_errors
def pipeline(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    mirror: MirrorOpt = None,
) -> None:
    """download → vocab → train → average → eval in one command, skipping finished stages."""
    cfg, run_dir = _setup(config, set_, run)
    from nmt.pipeline import run_pipeline

    run_pipeline(cfg, run_dir, mirror=mirror)


@app.command()
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

    cfg, _ = _setup(config, set_, run, create=False)
    model = build_model(cfg, src_vocab or cfg.vocab.src_size, tgt_vocab or cfg.vocab.tgt_size)
    typer.echo(model_summary(model))


@app.command()
@user_errors
def serve(
    run: RunOpt = None,
    checkpoint: CheckpointsOpt = None,
    beam: BeamOpt = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "auto",
    engine: EngineOpt = "native",
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
            help="Native engine: pick --precision auto and the int8 kernel measured fastest for one sentence "
            "at a time (few clients) or for batches (heavy load).",
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
    opts = _inference(run, checkpoint, device, precision, engine, beam=beam, rows=rows)
    access = LibreAccess.load(api_keys, req_limit)  # before loading the model: a bad file fails at once
    run_server(opts, ServeOptions(host, port, limits, log_level.value, access))


@app.command()
@user_errors
def backtranslate(
    run: RunOpt = None,
    mono: Annotated[
        str,
        typer.Option(
            "--mono",
            help="Monolingual text: a file, a directory with train.<lang>, or a hub dataset of text rows "
            "hub:NAME?config=C&split=S&column=K&limit=N.",
        ),
    ] = ...,
    output: Annotated[Path, typer.Option("--output", "-o", help="Mirror directory to write (train.jsonl).")] = ...,
    checkpoint: CheckpointsOpt = None,
    beam: BeamOpt = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "auto",
    engine: EngineOpt = "native",
    sample_topk: TopkOpt = None,
    sample_topp: ToppOpt = None,
    temperature: TemperatureOpt = None,
    seed: SeedOpt = 0,
    chunk: Annotated[int, typer.Option("--chunk", min=1, help="Sentences between two progress records.")] = 500,
) -> None:
    """Translate monolingual text with a reverse run into synthetic pairs (resumable)."""
    from nmt.decode.backtranslate import BacktranslateOptions
    from nmt.decode.backtranslate import backtranslate as run_backtranslation

    sampling = _sampling(sample_topk, sample_topp, temperature, seed)
    inference = _inference(run, checkpoint, device, precision, engine, beam=beam, sampling=sampling)
    stats = run_backtranslation(BacktranslateOptions(inference=inference, mono=mono, output=output, chunk=chunk))
    typer.echo(f"{stats['pairs']} synthetic pairs in {output / 'train.jsonl'} ({stats['seconds']} s)", err=True)


@app.command()
@user_errors
def doctor() -> None:
    """What this machine runs: the CPU, each hardware-dependent kernel (or why not), and the
    decoding precisions it offers with their measured speed, one sentence at a time and in batches."""
    from nmt.device import describe_host

    typer.echo(describe_host())


@app.command()
@user_errors
def plot(
    run: RunOpt = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Directory (default <run>/plots).")] = None,
) -> None:
    """Write a run's training curves (loss, validation BLEU, lr, tokens/s) as PNG files."""
    from nmt.serve.plot import plot_run

    for path in plot_run(_run_dir(run), output):
        typer.echo(f"wrote {path}")


def _run_dir(run: Path | None) -> Path:
    from nmt.runs import newest_model_run

    run_dir = run or newest_model_run()
    if not run_dir.is_dir():
        raise NmtError(f"{run_dir}: run directory not found (pass --run DIR)")
    return run_dir


def _format_summary(summary: dict) -> str:
    return "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items())


GC_GEN0 = 50_000  # allocations between young-generation collections (Python's default: 700)


def main() -> None:
    """The `nmt` command. Importing PyTorch leaves ~170,000 objects the collector tracks, and with
    Python's default thresholds the cyclic garbage collector walks them again and again while the
    rest starts up; collecting the young generation less often cuts that out of every command
    (docs/BENCHMARKS.md). Tensors are freed by reference counting, not by the collector, so a
    long training run or server holds no more memory for it."""
    gc.set_threshold(GC_GEN0)
    app()


if __name__ == "__main__":
    main()
