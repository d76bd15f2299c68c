"""Argos Translate packages: `nmt export --format argos` writes a run's model as an `.argosmodel`.

An `.argosmodel` is a zip of one folder, which `argostranslate.package.install_from_path`
unpacks into Argos Translate's packages directory (LibreTranslate reads the same directory):

    translate-zh_en-nmt/
      metadata.json        package_version, argos_version, from/to code and name, type "translate"
      model/               the CTranslate2 model of `nmt export --format ctranslate2` (ensure_export)
      sentencepiece.model  the run's source SentencePiece model, nmt's normalisation compiled in
      minisbd/zh.onnx      the sentence splitter (nmt/export/argos_sbd.py)
      README.md            provenance: run, checkpoint, step, config; the run's eval scores
      nmt.json             the export manifest (run, checkpoint, step, config, versions, digest)

What Argos Translate 1.11 does with it, and the choices that follow (costs measured in
docs/BENCHMARKS.md, "Argos Translate package"):

- One SentencePiece model for both sides: `sentencepiece.model` encodes the source and then
  decodes the target pieces (`decode_pieces`, then `▁` and `_` become spaces). nmt has two.
  Shipped: the source model, with the CTranslate2 vocabularies left as nmt's pieces (weights and
  ids unchanged). SentencePiece decodes a piece it does not hold as the piece itself, so every
  English piece comes out as its text with `▁` → space: nmt's target decoding, except that Argos
  turns `_` into a space. (A merged vocabulary would remap nothing that matters and could make
  the source segment differently.)
- Normalisation: Argos hands raw text to SentencePiece. nmt's NFKC and Traditional→Simplified
  (`nmt.data.normalize.normalize_source`) are compiled into the shipped model's normaliser
  (SentencePiece's precompiled character map: every character NFKC changes, every OpenCC t2s
  character and phrase, longest match first), so that `encode(raw)` equals nmt's
  `encode(normalize_source(raw))`. Not covered: NFKC composing a letter with a following
  combining mark, and the 53 OpenCC phrases that keep a character its own rule changes
  (乾隆, 乾坤, 哪吒: SentencePiece refuses rules that map a string to itself).
- Sentences: Argos splits each line into sentences before translating; nmt translates a line
  whole. Bundled: a rule-based splitter in MiniSBD's format (no download at install or first use;
  Argos would otherwise fetch a MiniSBD model, and a `stanza/` folder fetches stanza's
  resources.json on every start). Argos joins the sentences' pieces before decoding.
- Lost: pass-through spans (`data.passthrough`: Latin words, numbers, URLs, e-mails, marked
  text). Argos has no hook to mask them, so they reach a model trained to see placeholders
  instead; nmt's decode settings (beam, len_penalty, max_len_a/b, min_len) do not travel either:
  Argos decodes with beam max(4, hypotheses) (`ARGOS_BEAM_SIZE`), length penalty 0.2, at most
  256 tokens, and replaces `<unk>` with the most attended source piece.
"""

from __future__ import annotations

import dataclasses
import io
import json
import tempfile
import unicodedata
import zipfile
from pathlib import Path
from typing import Any

import nmt
from nmt.config import Config, DataConfig
from nmt.errors import NmtError
from nmt.export.argos_sbd import minisbd_model
from nmt.export.ct2_model import ExportOptions, ExportSource, ensure_export, resolve_source
from nmt.export.provenance import data_lines
from nmt.files import atomic_path
from nmt.run.layout import RunDir

SUFFIX = ".argosmodel"
ARGOS_VERSION = "1.11"  # the first Argos Translate that runs a package's own minisbd/ model
PACKAGE_VERSION = "1.0"
ARGOS_POSITIONS = 1026  # CTranslate2's defaults in Argos: max_input_length 1024 (+ EOS), max_decoding_length 256
NAMES = {"zh": "Chinese", "en": "English", "ja": "Japanese", "ko": "Korean", "fr": "French", "de": "German"}
MODEL_FILES = ("model.bin", "config.json", "shared_vocabulary.json", "source_vocabulary.json", "target_vocabulary.json")


def package_name(config: Config) -> str:
    """The package folder: one nmt package per language pair (a new export replaces the old one)."""
    return f"translate-{config.data.src_lang}_{config.data.tgt_lang}-nmt"


def default_output(run_dir: Path, checkpoint: Path, quantization: str | None) -> Path:
    """<run>/export/argos-<checkpoint name>-<weight type>.argosmodel"""
    return RunDir(run_dir).export / f"argos-{Path(checkpoint).stem}-{quantization or 'float32'}{SUFFIX}"


def _check_output(path: Path) -> Path:
    if path.suffix != SUFFIX:
        raise NmtError(f"--output {path}: an Argos Translate package is a file ending in {SUFFIX}")
    if path.is_dir():
        raise NmtError(f"--output {path}: is a directory; give a file name ending in {SUFFIX}")
    return path


def export_argos(opts: ExportOptions) -> Path:
    """`nmt export --format argos`: write the package of a run's checkpoint (atomically); its path."""
    if opts.output is not None:
        _check_output(Path(opts.output))
    src = resolve_source(opts.run_dir, opts.checkpoint)
    if not src.config.data.src_lang.startswith("zh"):
        raise NmtError(
            f"--format argos: a {src.config.data.src_lang}→{src.config.data.tgt_lang} run is not packaged "
            "(the bundled sentence splitter and the shared SentencePiece model are made for a Chinese source)"
        )
    out = _check_output(
        Path(opts.output) if opts.output else default_output(src.run_dir, src.checkpoint, opts.quantization)
    )
    model_dir = _ct2_model(src, opts.quantization)
    manifest = json.loads((model_dir / "manifest.json").read_text(encoding="utf-8"))
    manifest["config"]["model"]["max_positions"] = src.config.model.max_positions  # the trained table's
    files: dict[str, bytes | Path] = {f"model/{f}": model_dir / f for f in MODEL_FILES if (model_dir / f).is_file()}
    files["sentencepiece.model"] = source_model(src.src_model, src.config.data)
    files[f"minisbd/{src.config.data.src_lang}.onnx"] = minisbd_model(src.config.data.src_lang)
    files["metadata.json"] = _json(metadata(src.config))
    files["README.md"] = readme(src, manifest).encode("utf-8")
    files["nmt.json"] = _json(manifest | {"argos": _choices(src.config.data)})
    try:
        with atomic_path(out) as tmp:
            _write_zip(tmp, package_name(src.config), files)
    except OSError as e:
        raise NmtError(f"{out}: cannot write ({e.strerror or e})") from None
    return out


def _ct2_model(src: ExportSource, quantization: str | None) -> Path:
    """The CTranslate2 export of `src` (`ensure_export`; reused while fresh), with a sinusoidal
    position table of at least ARGOS_POSITIONS rows: Argos reads sources of up to 1,024 tokens and
    decodes up to 256, and CTranslate2 stops with an error past the table (nmt truncates instead).
    The rows beyond `model.max_positions` are the same sinusoids, untrained at those lengths."""
    model = src.config.model
    if model.positions != "sinusoidal" or model.max_positions >= ARGOS_POSITIONS:
        return ensure_export(src, None, quantization)  # the run's cache, shared with --engine ctranslate2
    wide = dataclasses.replace(model, max_positions=ARGOS_POSITIONS)
    wide_src = dataclasses.replace(src, config=dataclasses.replace(src.config, model=wide))
    out = RunDir(src.run_dir).export / f"argos-ct2-{src.checkpoint.stem}-{quantization or 'float32'}"
    return ensure_export(wide_src, out, quantization)


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _write_zip(path: Path, folder: str, files: dict[str, bytes | Path]) -> None:
    fixed = (2020, 1, 1, 0, 0, 0)  # same inputs, same bytes
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in ("", *sorted({n.rsplit("/", 1)[0] + "/" for n in files if "/" in n})):
            zf.writestr(zipfile.ZipInfo(f"{folder}/{name}", fixed), b"")
        for name, content in sorted(files.items()):
            info = zipfile.ZipInfo(f"{folder}/{name}", fixed)
            info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
            if isinstance(content, Path):
                with open(content, "rb") as f, zf.open(info, "w") as dest:
                    while chunk := f.read(1 << 20):
                        dest.write(chunk)
            else:
                zf.writestr(info, content)


# --------------------------------------------------------------------------- metadata and README


def metadata(config: Config) -> dict[str, Any]:
    """metadata.json: the fields Argos Translate reads."""
    src, tgt = config.data.src_lang, config.data.tgt_lang
    return {
        "package_version": PACKAGE_VERSION,
        "argos_version": ARGOS_VERSION,
        "from_code": src,
        "from_name": NAMES.get(src, src),
        "to_code": tgt,
        "to_name": NAMES.get(tgt, tgt),
        "type": "translate",
        "links": [],
    }


def _scores(run_dir: Path) -> list[dict[str, Any]]:
    """The run's evaluation reports (<run>/eval/*.json) that hold BLEU."""
    rows = []
    for path in sorted(RunDir(run_dir).eval.glob("*.json")):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(report, dict) and "bleu" in report:
            rows.append(report | {"report": path.name})
    return rows


def _score_table(rows: list[dict[str, Any]], checkpoint: Path) -> list[str]:
    if not rows:
        return ["No evaluation reports in the run (`nmt eval` writes them to `<run>/eval/`)."]
    lines = ["| report | split | checkpoint | decoding | sentences | BLEU | chrF |", "|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        d = r.get("decode") or {}
        how = f"{d.get('engine', '?')}, beam {d.get('beam', '?')}" if d else ""
        ckpt = Path(str(r.get("checkpoint", "?"))).name
        mark = " (this package)" if ckpt == checkpoint.name else ""
        lines.append(
            f"| {r['report']} | {r.get('split', '')} | {ckpt}{mark} | {how} | {r.get('sentences', '')} "
            f"| {r['bleu']:.2f} | {float(r.get('chrf', 'nan')):.2f} |"
        )
    return lines


def readme(src: ExportSource, manifest: dict[str, Any]) -> str:
    """README.md of the package: what it is, where it came from, how it scored, what differs from nmt."""
    c, m = src.config, src.config.model
    names = NAMES.get(c.data.src_lang, c.data.src_lang), NAMES.get(c.data.tgt_lang, c.data.tgt_lang)
    d = c.decode
    lines = [
        f"# {names[0]} → {names[1]} (nmt)",
        "",
        f"Made by `nmt export --format argos` (nmt {nmt.__version__}); "
        f"converted to CTranslate2 on {manifest['created']}.",
        "",
        f"- run: `{manifest['run']}`",
        f"- checkpoint: `{src.checkpoint.name}`, step {manifest['step']}; weights {manifest['quantization']}",
        f"- model: Transformer, d_model {m.d_model}, {m.heads} heads, {m.encoder_layers}+{m.decoder_layers} layers, "
        f"ffn {m.ffn_dim}, {m.activation}, {m.norm}-norm, {m.positions} positions, "
        f"{'tied' if m.tie_embeddings else 'untied'} embeddings, max {m.max_positions} positions",
        f"- vocabularies: SentencePiece {c.vocab.type}, {c.vocab.src_size} {c.data.src_lang} / "
        f"{c.vocab.tgt_size} {c.data.tgt_lang} pieces (requested sizes)",
        f"- data: corpus `{c.data.corpus}`, NFKC {c.data.nfkc}, Traditional→Simplified {c.data.t2s}, "
        f"pass-through {', '.join(c.data.passthrough) or 'off'}",
        f"- nmt's decoding: beam {d.beam}, length penalty {d.len_penalty}, "
        f"max length {d.max_len_a}·source + {d.max_len_b}",
        f"- CTranslate2 {manifest['ctranslate2_version']}; input digest `{manifest['inputs']}`",
        "",
        "## Training data",
        "",
        *data_lines(src.run_dir, c),
        "",
        "## Scores (nmt's own evaluation of the run, `<run>/eval/*.json`)",
        "",
        *_score_table(_scores(src.run_dir), src.checkpoint),
        "",
        "## What differs from nmt",
        "",
        *_differences(c),
    ]
    return "\n".join(lines) + "\n"


def _differences(config: Config) -> list[str]:
    data, model = config.data, config.model
    rows = max(model.max_positions, ARGOS_POSITIONS)
    limit = (
        f"the sinusoidal position table is extended from {model.max_positions} to {rows} rows (untrained lengths)"
        if model.positions == "sinusoidal"
        else f"a source over {model.max_positions - 1} pieces or a longer output stops Argos with an error "
        "(a learned position table cannot be extended)"
    )
    return [
        f"- Lengths: nmt truncates; Argos reads up to 1,024 source tokens and decodes up to 256, so {limit}.",
        "- Decoding: Argos Translate uses its own settings (beam 4 or `ARGOS_BEAM_SIZE`, length penalty 0.2, "
        "at most 256 tokens), not nmt's above.",
        "- Pass-through spans are lost: nmt replaces "
        + (", ".join(data.passthrough) or "no")
        + " spans by placeholders and restores them; Argos hands them to the model as text.",
        "- Normalisation is kept: "
        + _choices(data)["normalizer"]
        + " is compiled into `sentencepiece.model` (combining accents and 53 OpenCC phrases such as 乾隆 aside).",
        "- Sentences: each line is split after 。！？!? (and closing quotes) by `minisbd/`, a rule, not a trained "
        "model; nmt translates a line whole.",
        "- `_` in an output becomes a space (Argos's detokeniser).",
        "",
        "Requires Argos Translate 1.11 or later (MiniSBD); nothing is downloaded at install or first use.",
    ]


def _choices(data: DataConfig) -> dict[str, str]:
    kinds = [k for k, on in (("NFKC", data.nfkc), ("Traditional→Simplified", _t2s_on(data))) if on]
    return {
        "tokenizer": "source SentencePiece model; CTranslate2 vocabularies are nmt's pieces",
        "normalizer": " + ".join(kinds) or "none",
        "sentence_splitter": "rule-based MiniSBD model (nmt/export/argos_sbd.py)",
        "passthrough": "not applied (Argos has no hook)",
    }


# --------------------------------------------------------------------------- normalisation


def _t2s_on(data: DataConfig) -> bool:
    return data.t2s and data.src_lang.startswith("zh")  # as nmt.data.normalize.normalize_source


def normalizer_rules(data: DataConfig) -> dict[str, str]:
    """Source string → what nmt's normalisation makes of it, for every string it changes alone
    (whitespace aside: SentencePiece collapses runs of it as nmt does)."""
    if not data.nfkc and not _t2s_on(data):
        return {}
    keys: set[str] = set()
    if data.nfkc:
        for cp in range(0x110000):
            c = chr(cp)
            if not 0xD800 <= cp < 0xE000 and unicodedata.normalize("NFKC", c) != c:
                keys.add(c)
    convert = (lambda s: s) if not _t2s_on(data) else _opencc_t2s(keys)
    rules = {}
    for key in keys:
        value = convert(unicodedata.normalize("NFKC", key) if data.nfkc else key)
        if value and value != key:  # SentencePiece refuses identity rules: OpenCC phrases that keep a
            rules[key] = value  # character its own rule changes (乾隆, 乾坤, 哪吒: 53 of them) are not kept
    return rules


def _opencc_t2s(keys: set[str]) -> Any:
    """OpenCC's t2s converter (the one nmt uses); adds its dictionaries' entries to `keys`."""
    import opencc

    folder = Path(opencc.__file__).parent / "dictionary"
    for name in ("TSCharacters.txt", "TSPhrases.txt"):
        for line in (folder / name).read_text(encoding="utf-8").splitlines():
            if line.strip():
                keys.add(line.split("\t")[0])
    return opencc.OpenCC("t2s").convert


def compile_normalizer(rules: dict[str, str]) -> bytes:
    """SentencePiece's precompiled character map for `rules` (its trainer compiles it; a throwaway
    model is trained on a few characters to get it)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    def hexes(s: str) -> str:
        return " ".join(f"{ord(c):X}" for c in s)

    with tempfile.TemporaryDirectory() as tmp:
        tsv = Path(tmp) / "rules.tsv"
        tsv.write_text("".join(f"{hexes(k)}\t{hexes(v)}\n" for k, v in sorted(rules.items())), encoding="utf-8")
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(["abc 中文"] * 4),
            model_writer=model,
            model_type="char",
            vocab_size=12,
            hard_vocab_limit=False,
            normalization_rule_tsv=str(tsv),
            minloglevel=2,
            num_threads=1,
        )
    proto = pb.ModelProto()
    proto.ParseFromString(model.getvalue())
    return proto.normalizer_spec.precompiled_charsmap


def source_model(path: Path, data: DataConfig) -> bytes:
    """The source SentencePiece model with nmt's normalisation as its normaliser (serialized)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(Path(path).read_bytes())
    rules = normalizer_rules(data)
    if rules:
        proto.normalizer_spec.precompiled_charsmap = compile_normalizer(rules)
        proto.normalizer_spec.name = "nmt" + "_nfkc" * data.nfkc + "_t2s" * _t2s_on(data)
    return proto.SerializeToString()
