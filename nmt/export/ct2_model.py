"""CTranslate2, part 1: a run's checkpoint exported to a CTranslate2 model directory (the engine
that decodes with it is `nmt.decode.ct2`).

Optional extra (`pip install 'nmt[ctranslate2]'`): this module imports without the package, and
every entry point raises a one-line `NmtError` naming the extra when it is missing.

Export (`export_run`; `nmt export --format ctranslate2`) converts with `nmt.export.ct2_spec.NmtConverter`
(CTranslate2's own spec API, filled from nmt's state dict; the mapping is documented there).

Token i of each CTranslate2 vocabulary is SentencePiece piece i, the config adds EOS to every
source and starts the decoder with BOS, so an exported directory also works without nmt:
`sp.encode(text, out_type=str)` → `Translator.translate_batch` → `sp.decode(pieces)` (after
nmt's normalisation, `nmt.data.corpus.normalize_source`). Directory: model.bin, config.json,
{source,target}_vocabulary.json, both SentencePiece models, manifest.json (run, checkpoint,
step, config, versions, quantization, input digest).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import nmt
from nmt.config import YAML_LOADER, Config, config_from_dict, config_to_dict, load_config
from nmt.errors import NmtError
from nmt.export.provenance import training_data
from nmt.files import replace_dir
from nmt.run.layout import RunDir

try:
    import ctranslate2
except ImportError:  # the optional extra is not installed
    ctranslate2 = None

EXPORT_FORMATS = ("ctranslate2", "argos", "transformers")  # dispatched by nmt/export/formats.py
MANIFEST = "manifest.json"
EXPORT_REVISION = 1  # bump when the layout of an export changes (stale caches are rebuilt)
INSTALL_HINT = "pip install 'nmt[ctranslate2]'"


def installed() -> bool:
    """Whether the optional `ctranslate2` package is importable here."""
    return ctranslate2 is not None


def require_ctranslate2() -> Any:
    """The `ctranslate2` module, or a one-line NmtError naming the optional extra."""
    if ctranslate2 is None:
        raise NmtError(f"CTranslate2 is not installed: {INSTALL_HINT}")
    return ctranslate2


def quantizations() -> tuple[str, ...]:
    """The weight types the installed converter accepts for --quantization."""
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    return tuple(ACCEPTED_MODEL_TYPES)


@dataclass
class ExportOptions:
    """What `nmt export` writes: which run and checkpoint, where, in which weight type."""

    run_dir: Path
    checkpoint: Path | None = None  # None: the run's inference checkpoint (final > best > latest)
    output: Path | None = None  # None: <run>/export/ct2-<checkpoint>-<quantization>
    quantization: str | None = None  # None: float32 weights (see quantizations())
    format: str = "ctranslate2"


@dataclass
class ExportSource:
    """Everything an export is made from."""

    run_dir: Path
    checkpoint: Path
    config: Config  # the run's config, with the checkpoint's model section
    src_model: Path  # SentencePiece models
    tgt_model: Path


def resolve_source(run_dir: Path, checkpoint: Path | None, config: Config | None = None) -> ExportSource:
    """The checkpoint (default: final > best > latest), config and vocabularies of a run, as
    `Translator.from_run` finds them; the weights themselves are read only when converting."""
    from nmt.data.tokenizer import load_tokenizers
    from nmt.run.checkpoints import find_inference_checkpoint, read_metadata

    run_dir = Path(run_dir)
    path = Path(checkpoint) if checkpoint is not None else find_inference_checkpoint(run_dir)
    meta = read_metadata(path)
    if "config" not in meta:
        raise NmtError(f"{path}: checkpoint has no config in its metadata (not written by nmt)")
    stored = config_from_dict(yaml.load(meta["config"], Loader=YAML_LOADER) or {}, source=f"{path}:config")
    if config is None:
        saved = RunDir(run_dir).config
        config = load_config(saved) if saved.is_file() else stored
    config = dataclasses.replace(config, model=dataclasses.replace(stored.model))
    src_tok, tgt_tok = load_tokenizers(run_dir, config)
    return ExportSource(run_dir, path, config, src_tok.path, tgt_tok.path)


def _digest(src: ExportSource, quantization: str | None) -> str:
    from nmt.run.stamps import hash_files

    extra = {"quantization": quantization, "revision": EXPORT_REVISION, "ctranslate2": ctranslate2.__version__}
    return hash_files([src.checkpoint, src.src_model, src.tgt_model], extra)


def default_export_dir(run_dir: Path, checkpoint: Path, quantization: str | None) -> Path:
    """<run>/export/ct2-<checkpoint name>-<weight type>: the cache the engine reuses."""
    return RunDir(run_dir).export / f"ct2-{Path(checkpoint).stem}-{quantization or 'float32'}"


def export_is_current(out: Path, digest: str) -> bool:
    """True when `out` holds a complete export of the same inputs (its manifest digest)."""
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return manifest.get("inputs") == digest and (out / "model.bin").is_file()


def vocabulary_pieces(model: Path) -> list[str]:
    """The pieces of a SentencePiece model, by id (a CTranslate2 vocabulary)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def _write_export(src: ExportSource, out: Path, quantization: str | None, digest: str) -> Path:
    """Convert into a temporary directory next to `out`, then swap it in (never half-written)."""
    from nmt.export.ct2_spec import NmtConverter  # CTranslate2's converter imports PyTorch
    from nmt.run.checkpoints import checkpoint_step
    from nmt.run.weights import load_weights

    state, _ = load_weights(src.checkpoint)
    vocabularies = (vocabulary_pieces(src.src_model), vocabulary_pieces(src.tgt_model))
    converter = NmtConverter(state, src.config.model, vocabularies)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        try:
            converter.convert(str(tmp), quantization=quantization, force=True)
        except ValueError as e:  # the spec's own validation, e.g. a vocabulary of another size
            raise NmtError(f"{src.checkpoint}: CTranslate2 refused the model ({e})") from None
        shutil.copyfile(src.src_model, tmp / "source.model")
        shutil.copyfile(src.tgt_model, tmp / "target.model")
        manifest = {
            "format": "ctranslate2",
            "run": str(src.run_dir.resolve()),
            "checkpoint": str(src.checkpoint.resolve()),
            "step": checkpoint_step(src.checkpoint),
            "quantization": quantization or "float32",
            "source_model": "source.model",
            "target_model": "target.model",
            "nmt_version": nmt.__version__,
            "ctranslate2_version": ctranslate2.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "inputs": digest,
            "config": config_to_dict(src.config),
            "training_data": training_data(src.run_dir, src.config),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def ensure_export(src: ExportSource, output: Path | None, quantization: str | None) -> Path:
    """The export directory of `src` in `quantization`: reused when its manifest matches, else (re)written."""
    require_ctranslate2()
    if quantization is not None and quantization not in quantizations():
        raise NmtError(f"--quantization {quantization!r}: expected one of {' | '.join(quantizations())}")
    out = Path(output) if output is not None else default_export_dir(src.run_dir, src.checkpoint, quantization)
    digest = _digest(src, quantization)
    if export_is_current(out, digest):
        return out
    from nmt.export.ct2_spec import check_representable  # CTranslate2's converter imports PyTorch

    check_representable(src.config.model)
    if out.exists() and not (out / MANIFEST).is_file():
        raise NmtError(f"{out}: exists and is not an nmt export; choose another --output")
    try:
        return _write_export(src, out, quantization, digest)
    except OSError as e:
        hint = "nmt export --output DIR, then --checkpoint DIR"
        raise NmtError(f"{out}: cannot write ({e.strerror or e}); {hint}") from None


def fresh_export(run_dir: Path, checkpoint: Path) -> Path | None:
    """The engine's cached float32 export of `checkpoint` when it exists and is current, else None
    (nothing is converted; no PyTorch)."""
    if not installed():
        return None
    src = resolve_source(run_dir, checkpoint)
    out = default_export_dir(src.run_dir, src.checkpoint, None)
    return out if export_is_current(out, _digest(src, None)) else None


def export_run(opts: ExportOptions) -> Path:
    """The CTranslate2 export directory of a run's checkpoint, written or reused; returns its path.
    (`nmt export` goes through `nmt.export.formats`, which also knows the Argos package.)"""
    require_ctranslate2()
    return ensure_export(resolve_source(opts.run_dir, opts.checkpoint), opts.output, opts.quantization)
