"""Where a run lives: `runs/<name>/` named by a config or `--run`, `runs/latest`, the newest run
with a model, and a run's directory set up with its resolved config (layout: `nmt.run`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from nmt.config import Config, config_to_yaml, load_config
from nmt.errors import NmtError
from nmt.files import atomic_write_text
from nmt.run.layout import RunDir

RUNS_ROOT = Path("runs")


def default_run_dir(config: Config) -> Path:
    return RUNS_ROOT / config.name


def resolve_run(
    config_path: str | None, run: str | None, overrides: list[str] | None = None, need_model: bool = False
) -> tuple[Config, Path]:
    """Find the config and the run directory a command works on.

    - `--config` given: load it (plus overrides); run dir is `--run` or `runs/<config name>`.
    - only `--run` given: read `<run>/config.yaml`.
    - neither: `need_model` (translate, eval, average, serve): the newest run under `runs/`
      that has a model (`newest_model_run`); otherwise (stage commands) `runs/latest`.
    """
    if config_path:
        config = load_config(config_path, overrides)
        run_dir = Path(run) if run else default_run_dir(config)
        return config, run_dir
    default = newest_model_run if need_model else latest_run
    run_dir = Path(run) if run is not None else default()
    saved = RunDir(run_dir).config
    if not saved.is_file():
        raise NmtError(f"{saved}: not found: pass --config FILE, or --run a directory made by nmt")
    return load_config(saved, overrides), run_dir


def checkpoint_run(checkpoint: Path, default: Path | None = None) -> Path:
    """The run directory a checkpoint belongs to: the parent of its `checkpoints/` folder; for a
    checkpoint kept elsewhere, `default` (else the checkpoint's own folder)."""
    checkpoint = Path(checkpoint)
    if checkpoint.parent.name == "checkpoints":
        return checkpoint.parent.parent
    return default if default is not None else checkpoint.parent


def latest_run(root: Path = RUNS_ROOT) -> Path:
    """`runs/latest` resolved: the run a stage command (download, vocab, train, pipeline) last set up."""
    link = Path(root) / "latest"
    if not RunDir(link).config.is_file():
        raise NmtError(f"no --config given and {link} does not exist: pass --config FILE or --run DIR")
    return link.resolve()


def newest_model_run(root: Path = RUNS_ROOT) -> Path:
    """The run under `root` whose model files (final / best / complete step checkpoints) were
    written last: the default of every command that loads a model. Runs without a model
    (a benchmark's data-only run, a run whose training has not checkpointed yet) never are."""
    from nmt.run.checkpoints import model_files

    newest: tuple[float, Path] | None = None
    root = Path(root)
    for run_dir in sorted(root.iterdir()) if root.is_dir() else []:
        if run_dir.name == "latest" or not RunDir(run_dir).config.is_file():
            continue
        files = model_files(RunDir(run_dir).checkpoints)
        stamp = max((p.stat().st_mtime for p in files), default=None)
        if stamp is not None and (newest is None or stamp > newest[0]):
            newest = (stamp, run_dir.resolve())
    if newest is None:
        raise NmtError(
            f"no run with a trained model under {root}/: pass --run DIR "
            "(or train one: nmt pipeline --config configs/tiny.yaml)"
        )
    return newest[1]


def init_run(config: Config, run_dir: Path, latest: bool = True) -> Path:
    """Create the run directory and save the resolved config; with `latest`, point runs/latest
    at it (`mark_latest`). Benchmarks and other helpers pass latest=False."""
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = RunDir(run_dir).config
    text = config_to_yaml(config)
    if not saved.exists() or saved.read_text(encoding="utf-8") != text:
        atomic_write_text(saved, text)
    if latest:
        mark_latest(run_dir)
    return run_dir


def mark_latest(run_dir: Path, root: Path = RUNS_ROOT) -> None:
    """Point `runs/latest` at run_dir (relative symlink, replaced atomically).

    Only for runs directly under `runs/` (`root`): a run elsewhere (`--run /data/exp1`) never
    creates or moves a `latest` link, in its own parent or anywhere else."""
    run_dir, root = Path(run_dir).resolve(), Path(root).resolve()
    if run_dir.parent != root or run_dir.name == "latest":
        return
    link = root / "latest"
    tmp = root / f".latest.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.symlink(run_dir.name, tmp)
        os.replace(tmp, link)
    except OSError:  # filesystems without symlinks: not fatal
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
