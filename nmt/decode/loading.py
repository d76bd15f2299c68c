"""How a `Translator` gets its engine: `load` is the one function that builds it, and returns what
it built (`Loaded`: the engine, both tokenizers, the config, the checkpoint and the line that
says so). On the way: which engine and precision (`choose`: the one rule of every command, so
that they answer alike), on which device, with which config, and the native model (one
checkpoint or an ensemble) built from a checkpoint.

PyTorch is imported only on the native path: the CTranslate2 path of `nmt translate` never
imports it (start-up in a fraction of a second).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt.config import Config, load_config
from nmt.contracts import Engine, TokenizerLike
from nmt.decode.options import ENGINES, REFERENCE_PRECISION, InferenceOptions, Sampling
from nmt.errors import NmtError
from nmt.run.layout import RunDir

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Loaded:
    """What `load` built: the engine, the source and target tokenizers, the config the engine
    decodes with, the checkpoint (or export directory) it read, and what to say of it."""

    engine: Engine
    src_tok: TokenizerLike
    tgt_tok: TokenizerLike
    config: Config
    checkpoint: Path
    said: str  # 'loaded <checkpoint> (step N; why); --engine auto: ctranslate2'


def load(opts: InferenceOptions, run_dir: Path, config: Config | None = None) -> Loaded:
    """The engine of `opts` for `run_dir`, on the engine and precision of `choose` (the same for
    every command), with the run's tokenizers and the config of `inference_config`; an export
    directory named as the checkpoint brings its own vocabularies and config."""
    from nmt.data.tokenizer import load_tokenizers
    from nmt.run.checkpoints import choose_inference_checkpoint, describe_checkpoint, read_config

    picked = choose(opts, run_dir)
    opts = dataclasses.replace(opts, precision=picked.precision)
    if picked.name == "ctranslate2" and is_export(opts.checkpoint):
        export = Path(opts.checkpoint)
        engine, src_tok, tgt_tok, config = ct2_from_export(
            export, config, opts.device, opts.precision, opts.sampling, opts.threads
        )
        return Loaded(engine, src_tok, tgt_tok, config, export, f"loaded {export} (an nmt export){picked.note}")
    dev = device_for(picked.name, opts.device, opts.sampling)
    choice = choose_inference_checkpoint(run_dir) if opts.checkpoint is None else None
    path = Path(opts.checkpoint) if choice is None else choice.path
    config = inference_config(run_dir, config, read_config(path), dev.type)
    src_tok, tgt_tok = load_tokenizers(run_dir, config)
    if picked.name == "ctranslate2":
        engine = _ct2_engine(picked, run_dir, path, config, dev, opts)
    else:
        from nmt.decode.engines import NativeEngine

        sizes = (src_tok.vocab_size, tgt_tok.vocab_size)
        model = native_model(config, sizes, path, run_dir, opts.ensemble, dev.type)
        engine = NativeEngine(model, config.decode, dev, opts.precision, opts.rows)
    why = choice.reason if choice else "named explicitly"
    return Loaded(engine, src_tok, tgt_tok, config, path, describe_checkpoint(path, why) + picked.note)


def _ct2_engine(
    picked: EngineChoice, run_dir: Path, path: Path, config: Config, dev: Any, opts: InferenceOptions
) -> Engine:
    """The CTranslate2 engine of checkpoint `path`: the export `--engine auto` found current, else
    the run's export of it (written where missing or stale)."""
    from nmt.decode.ct2 import CTranslate2Engine

    if picked.export is not None:
        return CTranslate2Engine(picked.export, config.decode, dev, opts.precision, opts.threads)
    return CTranslate2Engine.from_checkpoint(run_dir, path, config, dev, opts.precision, opts.threads)


@dataclass(frozen=True)
class EngineChoice:
    """The engine and precision a `Translator` decodes with, what to say of them, and (for
    `--engine auto`) the current CTranslate2 export it found, decoded as found (not looked up a
    second time)."""

    name: str  # native | ctranslate2
    precision: str = REFERENCE_PRECISION  # what the engine is asked for; it may resolve further ('auto' on an export)
    note: str = ""  # appended to the `loaded …` line
    export: Path | None = None


def choose(opts: InferenceOptions, run_dir: Path) -> EngineChoice:
    """The engine and precision that `opts` decode `run_dir`'s model with: the one rule of every
    command (translate, eval, serve's own and LibreTranslate routes, backtranslate), so that for
    one model and one input they answer alike. `--engine auto` is CTranslate2 where the model has
    a current export (`auto_export`), else native; `--precision auto` is `REFERENCE_PRECISION`
    (fp32) on either, the precision whose output both engines share: CTranslate2 float32 decodes
    the same tokens as the native fp32 engine (greedy exactly; for beam search see
    nmt/decode/ct2.py), while bf16 and int8 change a few lines in a hundred and are used only when
    asked for. An export directory named as the checkpoint keeps 'auto': its saved type is the
    model. NmtError for an unknown engine or an ensemble on CTranslate2."""
    picked = resolve_engine(opts.engine, run_dir, opts.checkpoint, opts.ensemble)
    precision = opts.precision
    if precision == "auto" and not (picked.name == "ctranslate2" and is_export(opts.checkpoint)):
        precision = REFERENCE_PRECISION
    return dataclasses.replace(picked, precision=precision)


def is_export(checkpoint: Path | None) -> bool:
    """Whether `checkpoint` names a model directory (an `nmt export`), not a checkpoint file."""
    return checkpoint is not None and Path(checkpoint).is_dir()


def resolve_engine(
    engine: str, run_dir: Path, checkpoint: Path | None, ensemble: tuple[Path, ...] = ()
) -> EngineChoice:
    """`engine` checked, `auto` resolved by `auto_export`; an ensemble on another engine refused."""
    if engine not in ENGINES:
        raise NmtError(f"--engine {engine!r}: expected one of {' | '.join(ENGINES)}")
    choice = EngineChoice(engine)
    if engine == "auto":
        export = auto_export(run_dir, checkpoint, ensemble)
        name = "native" if export is None else "ctranslate2"
        choice = EngineChoice(name, note=f"; --engine auto: {name}", export=export)
    if ensemble and choice.name != "native":
        raise NmtError(f"--checkpoint more than once: ensembles decode with the native engine, not {choice.name}")
    return choice


def device_for(engine: str, device: str, sampling: Sampling | None) -> Any:
    """`device` resolved by the engine's own runtime (CTranslate2's device count, or PyTorch's);
    CTranslate2's sampling is seeded here, before its threads first sample."""
    if engine == "ctranslate2":
        from nmt.decode.ct2 import ct2_device, seed_sampling

        dev = ct2_device(device)
        if sampling is not None:
            seed_sampling(sampling.seed)
        return dev
    from nmt.hw.device import resolve_device

    return resolve_device(device)


def ct2_from_export(
    model_dir: Path, config: Config | None, device: str, precision: str, sampling: Sampling | None, threads: int
) -> tuple:
    """An `nmt export` directory on its own: (engine, source tokenizer, target tokenizer, config)."""
    from nmt.decode.ct2 import CTranslate2Engine

    dev = device_for("ctranslate2", device, sampling)
    return CTranslate2Engine.from_export(model_dir, config, dev, precision, threads)


def auto_export(run_dir: Path, checkpoint: Path | None, ensemble: tuple[Path, ...] = ()) -> Path | None:
    """What `--engine auto` decodes with CTranslate2: the model to load when it is an export
    directory, else its current export in the run's cache (`nmt export`, `nmt pipeline`, or an
    earlier `--engine ctranslate2`); None (native) without the package, for an ensemble
    (native-only) or without a current export. Nothing is converted here."""
    from nmt.export.ct2_model import fresh_export, installed
    from nmt.run.checkpoints import find_inference_checkpoint

    if ensemble or not installed():
        return None
    path = Path(checkpoint) if checkpoint is not None else find_inference_checkpoint(run_dir)
    return path if path.is_dir() else fresh_export(run_dir, path)


def inference_config(run_dir: Path, config: Config | None, stored: Config, device_type: str) -> Config:
    """The run's config (or `config`) with the checkpoint's own model section, usable on a
    `device_type` ("cpu" | "cuda") device."""
    saved = RunDir(run_dir).config
    if config is None:
        config = load_config(saved) if saved.is_file() else stored
    config = dataclasses.replace(config, model=dataclasses.replace(stored.model))
    if config.model.attention == "flash" and device_type != "cuda":
        config.model.attention = "auto"  # trained with flash on a GPU, decoded elsewhere
    return config


def load_ensemble(
    first: torch.nn.Module, run_dir: Path, config: Config, paths: tuple[Path, ...], device_type: str
) -> torch.nn.Module:
    """`first` and the models of `paths` as one `Ensemble`. Each member keeps its own shape (from
    its checkpoint); all must share the first model's vocabularies (files of the runs they belong to)."""
    from nmt.model.ensemble import Ensemble, check_vocabularies
    from nmt.run.checkpoints import read_config
    from nmt.run.dirs import checkpoint_run

    def vocab(run: Path) -> tuple[Path, Path]:
        return tuple(RunDir(run).vocab_model(lang) for lang in (config.data.src_lang, config.data.tgt_lang))

    members, vocabs = [first], [vocab(run_dir)]
    for path in map(Path, paths):
        stored = read_config(path)
        vocabs.append(vocab(checkpoint_run(path, default=run_dir)))
        check_vocabularies(vocabs)
        sizes = (first.src_vocab, first.tgt_vocab)
        members.append(load_model(inference_config(run_dir, config, stored, device_type), *sizes, path))
        print(f"ensemble member {len(members)}: {path}", file=sys.stderr)
    return Ensemble(members)


def native_model(
    config: Config, sizes: tuple[int, int], path: Path, run_dir: Path, ensemble: tuple[Path, ...], device_type: str
) -> torch.nn.Module:
    """The model at `path` (`sizes`: source and target vocabularies), or the ensemble of it and
    the checkpoints `ensemble` names."""
    model = load_model(config, *sizes, path)
    return load_ensemble(model, run_dir, config, ensemble, device_type) if ensemble else model


def load_model(config: Config, src_vocab: int, tgt_vocab: int, path: Path) -> torch.nn.Module:
    """The Transformer of `config` with the weights read from `path`, built without the random
    initialisation that the checkpoint overwrites (`without_initialisation`; the strict
    `load_state_dict` below fails if any parameter is missing from the checkpoint)."""
    from nmt.model.transformer import build_model, without_initialisation
    from nmt.run.weights import load_weights

    with without_initialisation():
        model = build_model(config, src_vocab, tgt_vocab)
    state, _ = load_weights(path)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
        raise NmtError(f"{path}: does not fit the vocabularies beside it ({first})") from None
    return model
