"""What the `nmt` commands share: their option types, the one-line handling of user errors, and
the helpers that turn options into a run directory or an `InferenceOptions`."""

from __future__ import annotations

import enum
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from nmt.errors import NmtError

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
    str,
    typer.Option(
        "--precision",
        help="auto | fp32 | bf16 | int8 (auto = fp32, the output every command gives; bf16 and int8 are "
        "faster where nmt doctor measures them so, with slightly different output)",
    ),
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
    """What the native engine's int8 kernel is measured for."""

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


def setup_run(
    config: Path | None, overrides: list[str] | None, run: Path | None, create: bool = True, need_model: bool = False
) -> tuple[Any, Path]:
    """(config, run directory) of a command's --config/--set/--run (`nmt.run.dirs.resolve_run`); the run
    directory is created with its resolved config.yaml unless `create` is False."""
    from nmt.run.dirs import init_run, resolve_run

    cfg, run_dir = resolve_run(str(config) if config else None, str(run) if run else None, overrides, need_model)
    if create:
        init_run(cfg, run_dir)
    return cfg, run_dir


def inference_options(
    run: Path | None, checkpoints: list[Path] | None, device: str, precision: str, engine: str, **more: Any
) -> Any:
    """The `nmt.decode.options.InferenceOptions` of a command's model options (`more`: beam, nbest,
    sampling...). `--checkpoint` given once or more: the first is the model, the rest its ensemble."""
    from nmt.decode.options import InferenceOptions

    models = {"checkpoint": checkpoints[0], "ensemble": tuple(checkpoints[1:])} if checkpoints else {}
    return InferenceOptions(run_dir=run, **models, device=device, precision=precision, engine=engine, **more)


def sampling_options(topk: int | None, topp: float | None, temperature: float | None, seed: int) -> Any:
    """A `nmt.decode.options.Sampling` when any sampling option is given, else None (beam search)."""
    if topk is None and topp is None and temperature is None:
        return None
    from nmt.decode.options import Sampling

    return Sampling(
        topk=0 if topk is None else topk,
        topp=1.0 if topp is None else topp,
        temperature=1.0 if temperature is None else temperature,
        seed=seed,
    )


def read_lines(texts: list[str] | None, path: Path | None) -> list[str]:
    """Sentences from the arguments, a file or stdin (invalid UTF-8 becomes U+FFFD)."""
    if texts:
        return list(texts)
    if path is not None and not path.is_file():
        raise NmtError(f"{path}: input file not found")
    data = path.read_bytes() if path is not None else sys.stdin.buffer.read()
    return data.decode("utf-8", errors="replace").splitlines()


def existing_run(run: Path | None) -> Path:
    """`--run`, or the newest run under runs/ with a model; NmtError where it does not exist."""
    from nmt.run.dirs import newest_model_run

    run_dir = run or newest_model_run()
    if not run_dir.is_dir():
        raise NmtError(f"{run_dir}: run directory not found (pass --run DIR)")
    return run_dir


def format_summary(summary: dict) -> str:
    """A training summary as one `key=value` line."""
    return "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items())
