"""Hugging Face transformers: `nmt export --format transformers` writes a run's checkpoint as a folder
that `AutoModelForSeq2SeqLM.from_pretrained(dir)` and `AutoTokenizer.from_pretrained(dir)` load
with the classes transformers ships (no remote code); `pipeline("translation", model=dir)` runs it
where the installed transformers still has that task (4.x: transformers 5 removed it).

Optional extra (`pip install 'nmt[transformers]'`, transformers 5): this module imports without the
package, and the export raises a one-line `NmtError` naming the extra when it is missing.

Which class. nmt's Transformer (nmt/model/transformer.py) scales embeddings by sqrt(d_model), adds
sinusoidal positions from 0 with frequencies 10000^(-2i/D), uses biased Q/K/V/out and FFN linears,
`nn.LayerNorm` (eps 1e-5), ReLU or exact GELU, separate source and target vocabularies. Of
transformers' encoder-decoders, two have exactly that except the norm placement:

    model.norm  class                                 why
    pre         PegasusForConditionalGeneration       pre-norm layers, a final LayerNorm per stack,
                                                      no LayerNorm on the embeddings (MBart has
                                                      one; M2M100/NLLB and FSMT use fairseq's
                                                      sinusoids: other frequencies, offset 2)
    post        MarianMTModel                         post-norm layers, no final norms;
                                                      `share_encoder_decoder_embeddings: false`
                                                      keeps the two vocabularies apart

Both build their sinusoids as [sin of every frequency | cos of every frequency]; nmt interleaves
them (sin at even, cos at odd dims). The frequencies are the same, so the export permutes the
model dimension: HF dim j is nmt dim `PERM[j]` (0, 2, 4, ..., 1, 3, 5, ...) in every weight that
reads or writes the residual stream (embeddings, Q/K/V and fc1 columns, out_proj and fc2 rows
and biases, LayerNorms, the output projection). LayerNorm and attention do not depend on the
order of the model dimension, so the permuted model computes the same function, and HF's own
position table (recomputed at load) is nmt's. Learned positions are permuted the same way.

Vocabularies. Pegasus has one input table for encoder and decoder (transformers 4 always ties
them; 5 unties them with `tie_word_embeddings: false`, which would make an export for one version
load wrongly in the other). So the export stacks both: rows [0, Vt) are nmt's target (en) table,
rows [Vt, Vt + Vs) its source (zh) table, and the source ids the tokenizer writes are shifted by
Vt (`source_ids`), except PAD, BOS and EOS, which keep ids 0, 2, 3 on both sides: row 3 holds the
source's EOS embedding (the decoder never reads a target EOS). `tie_word_embeddings: false` and
`lm_head` (Vt + Vs rows: nmt's output projection, then zeros) with `final_logits_bias` -inf on the
source rows: they are never generated, and the softmax over the target rows is nmt's. Marian keeps
the two vocabularies (`share_encoder_decoder_embeddings: false`) and nmt's tying as they are.

Decoding. generation_config.json carries nmt's settings where transformers has them: decoder start
BOS (2), EOS 3, PAD 0, `suppress_tokens` PAD and BOS (nmt never generates them; applied after the
log-softmax, as nmt masks them), `min_new_tokens = decode.min_len`, `num_beams = decode.beam`,
`length_penalty` (transformers divides by the output length with EOS, as nmt does),
`early_stopping: true` (stop at `beam` finished hypotheses, nmt's criterion), `no_repeat_ngram_size`.
nmt's per-sentence length limit floor(max_len_a * src_len + max_len_b) has no counterpart:
`max_length` is `model.max_positions` (pass `max_new_tokens` to limit it).

Tokenizer: `MarianTokenizer` with `separate_vocabs`: source.spm (the run's zh SentencePiece model
with nmt's NFKC and Traditional→Simplified compiled into its normaliser, `nmt.export.argos.source_model`),
target.spm (the en model), vocab.json (piece → `source_ids`) / target_vocab.json (piece → nmt id);
it appends EOS to the source as nmt does. What differs from `nmt translate` is in docs/export.md
and the folder's README.md.

Folder: config.json, generation_config.json, model.safetensors, the tokenizer files, README.md
(model card), manifest.json (run, checkpoint, step, config, versions).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nmt
from nmt import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt.config import Config, ModelConfig, config_to_dict
from nmt.errors import NmtError
from nmt.export.ct2_model import ExportOptions, ExportSource, resolve_source
from nmt.export.model_options import refuse_unsupported
from nmt.export.provenance import data_lines
from nmt.files import replace_dir
from nmt.run.layout import RunDir

if TYPE_CHECKING:
    from torch import Tensor

INSTALL_HINT = "pip install 'nmt[transformers]'"
MANIFEST = "manifest.json"
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, nmt's and both HF classes'

# ModelConfig fields and what the exporter does with them; a field not listed (a newer option) is refused.
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu"}  # HF "gelu" is the exact (erf) GELU, as torch's F.gelu
_CLASSES = {"pre": "PegasusForConditionalGeneration", "post": "MarianMTModel"}
_SUPPORTED = {"activation": set(_ACTIVATIONS), "norm": set(_CLASSES), "positions": {"sinusoidal", "learned"}}


def installed() -> bool:
    """Whether the optional `transformers` package is importable here (without importing it)."""
    return importlib.util.find_spec("transformers") is not None


def require_transformers() -> Any:
    """The `transformers` module (5 or later), or a one-line NmtError naming the optional extra.
    Imported here, not at module level: `nmt export` of other formats should not pay for it."""
    if not installed():
        raise NmtError(f"transformers is not installed: {INSTALL_HINT}")
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        raise NmtError(f"transformers {transformers.__version__} is too old (5 or later unties Pegasus's vocabularies)")
    return transformers


def check_exportable(cfg: ModelConfig) -> None:
    """NmtError naming the first model option that no transformers class reproduces exactly."""
    refuse_unsupported(cfg, _SUPPORTED, "transformers")
    if cfg.d_model % 2:
        raise NmtError(f"model.d_model: {cfg.d_model} is odd; transformers' sinusoids need an even d_model")


def hf_class(cfg: ModelConfig) -> str:
    """The transformers model class an nmt model of `cfg` exports to (see the module docstring)."""
    return _CLASSES[cfg.norm]


def dim_permutation(d_model: int) -> Tensor:
    """(D,) long: HF model dimension j holds nmt dimension PERM[j]; sin dims (even) first, then cos (odd)."""
    import torch

    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


# --------------------------------------------------------------------------- weights


class _Weights:
    """nmt's state dict read once per entry (every entry must be used), written under HF's names."""

    def __init__(self, state: dict[str, Tensor], cfg: ModelConfig):
        self.state = {k: v.detach().float().cpu() for k, v in state.items()}
        self.perm = dim_permutation(cfg.d_model)
        self.used: set[str] = set()
        self.out: dict[str, Tensor] = {}

    def take(self, name: str) -> Tensor:
        if name not in self.state:
            raise NmtError(f"checkpoint has no parameter {name!r} (not an nmt Transformer of this config)")
        self.used.add(name)
        return self.state[name]

    def reads(self, hf: str, w: Tensor, b: Tensor | None) -> None:
        """A linear layer whose input is the residual stream: permute its weight's columns."""
        self.out[f"{hf}.weight"] = w[:, self.perm].contiguous()
        if b is not None:
            self.out[f"{hf}.bias"] = b.clone()

    def writes(self, hf: str, w: Tensor, b: Tensor) -> None:
        """A linear layer whose output is added to the residual stream: permute its rows and bias."""
        self.out[f"{hf}.weight"] = w[self.perm].contiguous()
        self.out[f"{hf}.bias"] = b[self.perm].contiguous()

    def norm(self, hf: str, nmt_name: str) -> None:
        self.out[f"{hf}.weight"] = self.take(f"{nmt_name}.weight")[self.perm].contiguous()
        self.out[f"{hf}.bias"] = self.take(f"{nmt_name}.bias")[self.perm].contiguous()

    def table(self, hf: str, table: Tensor, rows: int) -> None:
        """An embedding or output table (V, D): columns permuted, zero rows appended up to `rows`."""
        padded = table.new_zeros(rows, table.size(1))
        padded[: table.size(0)] = table
        self.out[hf] = padded[:, self.perm].contiguous()


def _attention(w: _Weights, hf: str, nmt_name: str, D: int) -> None:
    """nmt's fused in_proj rows [Wq; Wk; Wv] → HF's q_proj, k_proj, v_proj; out_proj."""
    in_w, in_b = w.take(f"{nmt_name}.in_proj.weight"), w.take(f"{nmt_name}.in_proj.bias")
    for i, part in enumerate(("q_proj", "k_proj", "v_proj")):
        w.reads(f"{hf}.{part}", in_w[i * D : (i + 1) * D], in_b[i * D : (i + 1) * D])
    w.writes(f"{hf}.out_proj", w.take(f"{nmt_name}.out_proj.weight"), w.take(f"{nmt_name}.out_proj.bias"))


def _ffn(w: _Weights, hf: str, nmt_name: str) -> None:
    w.reads(f"{hf}.fc1", w.take(f"{nmt_name}.ffn.fc1.weight"), w.take(f"{nmt_name}.ffn.fc1.bias"))
    w.writes(f"{hf}.fc2", w.take(f"{nmt_name}.ffn.fc2.weight"), w.take(f"{nmt_name}.ffn.fc2.bias"))
    w.norm(f"{hf}.final_layer_norm", f"{nmt_name}.ffn_block.norm")


def convert_state(state: dict[str, Tensor], cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> dict[str, Tensor]:
    """nmt's state dict → the state dict of `hf_class(cfg)` (HF names, permuted model dimension).

    Pegasus (pre-norm): one input table of Vt + Vs rows (`merged_table`) under every name
    transformers 4 or 5 may read it from (`model.shared`, the encoder's and decoder's
    `embed_tokens`), `lm_head` (Vt + Vs, D) with nmt's output rows first, `final_logits_bias`
    (1, Vt + Vs) -inf past the target rows. Marian (post-norm): the two tables at their own sizes
    (`lm_head` is the decoder's table when tied). Every nmt entry must be used.
    """
    import torch

    check_exportable(cfg)
    D, pegasus = cfg.d_model, cfg.norm == "pre"
    w = _Weights(state, cfg)
    src_table, tgt_table = w.take("src_embed.weight"), w.take("tgt_embed.weight")
    out = tgt_table if cfg.tie_embeddings else w.take("output_proj.weight")
    if pegasus:
        rows = tgt_vocab + src_vocab
        merged = torch.cat([tgt_table, src_table])  # (Vt + Vs, D)
        merged[EOS_ID] = src_table[EOS_ID]  # the source's EOS; the decoder never reads the target's
        for name in ("model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens"):
            w.table(f"{name}.weight", merged, rows)
    else:
        rows = tgt_vocab
        w.table("model.encoder.embed_tokens.weight", src_table, src_vocab)
        w.table("model.decoder.embed_tokens.weight", tgt_table, tgt_vocab)
    w.table("lm_head.weight", out, rows)  # Marian, tied: the same parameter as the decoder's table
    bias = torch.zeros(1, rows)
    bias[0, tgt_vocab:] = float("-inf")
    w.out["final_logits_bias"] = bias
    for side, nmt_side in (("encoder", "src"), ("decoder", "tgt")):
        if cfg.positions == "learned":
            w.table(f"model.{side}.embed_positions.weight", w.take(f"{nmt_side}_positions.weight"), cfg.max_positions)
        else:
            from nmt.model.transformer import sinusoidal_table

            w.table(f"model.{side}.embed_positions.weight", sinusoidal_table(cfg.max_positions, D), cfg.max_positions)
    for i in range(cfg.encoder_layers):
        hf, p = f"model.encoder.layers.{i}", f"encoder.layers.{i}"
        _attention(w, f"{hf}.self_attn", f"{p}.self_attn", D)
        w.norm(f"{hf}.self_attn_layer_norm", f"{p}.attn_block.norm")
        _ffn(w, hf, p)
    for i in range(cfg.decoder_layers):
        hf, p = f"model.decoder.layers.{i}", f"decoder.layers.{i}"
        _attention(w, f"{hf}.self_attn", f"{p}.self_attn", D)
        w.norm(f"{hf}.self_attn_layer_norm", f"{p}.self_block.norm")
        _attention(w, f"{hf}.encoder_attn", f"{p}.cross_attn", D)
        w.norm(f"{hf}.encoder_attn_layer_norm", f"{p}.cross_block.norm")
        _ffn(w, hf, p)
    if pegasus:
        w.norm("model.encoder.layer_norm", "encoder.norm")
        w.norm("model.decoder.layer_norm", "decoder.norm")
    unused = sorted(set(w.state) - w.used)
    if unused:
        raise NmtError(f"parameter {unused[0]!r} has no transformers counterpart; this model cannot be exported")
    return w.out


def hf_config(cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> Any:
    """The `PegasusConfig` or `MarianConfig` of an nmt model (inference: every dropout 0)."""
    tf = require_transformers()
    common = {
        "d_model": cfg.d_model,
        "encoder_layers": cfg.encoder_layers,
        "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.heads,
        "decoder_attention_heads": cfg.heads,
        "encoder_ffn_dim": cfg.ffn_dim,
        "decoder_ffn_dim": cfg.ffn_dim,
        "activation_function": _ACTIVATIONS[cfg.activation],
        "max_position_embeddings": cfg.max_positions,
        "scale_embedding": True,  # sqrt(d_model), as nmt
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "pad_token_id": PAD_ID,
        "eos_token_id": EOS_ID,
        "bos_token_id": BOS_ID,
        "decoder_start_token_id": BOS_ID,
        "forced_eos_token_id": None,
    }
    if cfg.norm == "pre":
        return tf.PegasusConfig(vocab_size=tgt_vocab + src_vocab, tie_word_embeddings=False, **common)
    return tf.MarianConfig(
        vocab_size=src_vocab,
        decoder_vocab_size=tgt_vocab,
        share_encoder_decoder_embeddings=False,
        tie_word_embeddings=cfg.tie_embeddings,
        **common,
    )


def generation_config(config: Config) -> Any:
    """nmt's `decode` section where transformers has a counterpart (see the module docstring)."""
    tf = require_transformers()
    d = config.decode
    return tf.GenerationConfig(
        decoder_start_token_id=BOS_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        forced_eos_token_id=None,
        suppress_tokens=[PAD_ID, BOS_ID],
        min_new_tokens=d.min_len,
        num_beams=d.beam,
        length_penalty=d.len_penalty,
        early_stopping=True,
        no_repeat_ngram_size=d.no_repeat_ngram,
        max_length=config.model.max_positions,
    )


# --------------------------------------------------------------------------- tokenizer


def source_ids(cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> list[int]:
    """(Vs,) the exported model's id of each nmt source id. Marian: the same. Pegasus (one input
    table, `convert_state`): Vt + i, except PAD, BOS and EOS, which keep the target's ids 0, 2, 3
    (row 3 holds the source's EOS), so that the tokenizer's special ids (read from the source
    vocabulary) are the ids generation writes and `skip_special_tokens` drops; UNK stays Vt + 1
    (the decoder may read the target's UNK at row 1)."""
    if cfg.norm != "pre":
        return list(range(src_vocab))
    shared = {PAD_ID, BOS_ID, EOS_ID}
    return [i if i in shared else tgt_vocab + i for i in range(src_vocab)]


def _piece_ids(model: Path | bytes) -> dict[str, int]:
    """piece → id of a SentencePiece model (a vocab.json of MarianTokenizer)."""
    import sentencepiece as spm

    sp = (
        spm.SentencePieceProcessor(model_proto=model)
        if isinstance(model, bytes)
        else spm.SentencePieceProcessor(model_file=str(model))
    )
    return {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}


def write_tokenizer(src: ExportSource, out: Path) -> None:
    """MarianTokenizer files into `out`: source.spm with nmt's normalisation compiled in, target.spm,
    vocab.json (piece → `source_ids`) / target_vocab.json (piece → nmt's id), tokenizer_config.json."""
    from nmt.export.argos import source_model

    tf = require_transformers()
    source = source_model(src.src_model, src.config.data)
    (out / "source.spm").write_bytes(source)
    shutil.copyfile(src.tgt_model, out / "target.spm")
    vocabs = _piece_ids(source), _piece_ids(src.tgt_model)
    ids = source_ids(src.config.model, len(vocabs[0]), len(vocabs[1]))
    hf_vocab = {piece: ids[i] for piece, i in vocabs[0].items()}
    for name, vocab in zip(("vocab.json", "target_vocab.json"), (hf_vocab, vocabs[1]), strict=True):
        (out / name).write_text(json.dumps(vocab, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    specials = {"unk_token": UNK_ID, "eos_token": EOS_ID, "pad_token": PAD_ID, "bos_token": BOS_ID}
    names = {}
    for key, i in specials.items():
        by_id = {v: k for k, v in vocabs[0].items()}, {v: k for k, v in vocabs[1].items()}
        if by_id[0].get(i) != by_id[1].get(i):
            raise NmtError(
                f"special id {i} is {by_id[0].get(i)!r} in the source model, {by_id[1].get(i)!r} in the target"
            )
        names[key] = by_id[0][i]
    tokenizer = tf.MarianTokenizer(
        source_spm=str(out / "source.spm"),
        target_spm=str(out / "target.spm"),
        vocab=str(out / "vocab.json"),
        target_vocab_file=str(out / "target_vocab.json"),
        separate_vocabs=True,
        source_lang=src.config.data.src_lang,
        target_lang=src.config.data.tgt_lang,
        model_max_length=src.config.model.max_positions,  # pieces + EOS
        **names,
    )
    tokenizer.save_pretrained(str(out))


# --------------------------------------------------------------------------- model card


def _scores(run_dir: Path) -> list[str]:
    """Markdown lines for the run's test report (<run>/eval/test.json), with signatures."""
    path = RunDir(run_dir).eval_report("test")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return ["No test report in the run (`nmt eval --split test` writes `<run>/eval/test.json`)."]
    d = report.get("decode") or {}
    beam, nan = d.get("beam", "?"), float("nan")
    lines = [
        f"nmt's own decoding of the test set ({report.get('sentences', '?')} sentences, checkpoint "
        f"`{Path(str(report.get('checkpoint', '?'))).name}`, {d.get('engine', '?')} engine, beam {beam}):",
        "",
        "| decoding | BLEU | chrF |",
        "|---|---:|---:|",
        f"| beam {beam} | {report.get('bleu', nan):.2f} | {report.get('chrf', nan):.2f} |",
    ]
    greedy = report.get("greedy")
    if isinstance(greedy, dict) and "bleu" in greedy:
        lines.append(f"| greedy | {greedy['bleu']:.2f} | {greedy.get('chrf', float('nan')):.2f} |")
    lines += ["", f"- BLEU signature: `{report.get('bleu_signature', '?')}`"]
    lines.append(f"- chrF signature: `{report.get('chrf_signature', '?')}`")
    return lines


def model_card(src: ExportSource, manifest: dict[str, Any], command: str) -> str:
    """README.md of the folder: what it is, how to run it, data and licences, scores, differences, provenance."""
    c, m, d = src.config, src.config.model, src.config.decode
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: translation",
        f"language: [{c.data.src_lang}, {c.data.tgt_lang}]",
        "---",
        "",
        f"# {c.data.src_lang} → {c.data.tgt_lang} translation (nmt, {manifest['class']})",
        "",
        f"Exported from an nmt run by `{command}` (nmt {nmt.__version__}, transformers "
        f"{manifest['transformers_version']}, {manifest['created']}).",
        "",
        "```python",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        'model = AutoModelForSeq2SeqLM.from_pretrained("{this folder}")',
        'tokenizer = AutoTokenizer.from_pretrained("{this folder}")',
        'batch = tokenizer(["我们九点见。"], return_tensors="pt", padding=True)',
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))",
        "# transformers 4.x only (5 removed the task): pipeline('translation', model='{this folder}')",
        "```",
        "",
        "## Model",
        "",
        f"- {manifest['class']}: Transformer, d_model {m.d_model}, {m.heads} heads, "
        f"{m.encoder_layers}+{m.decoder_layers} layers, FFN {m.ffn_dim}, {m.activation}, {m.norm}-norm, "
        f"{m.positions} positions, {'tied' if m.tie_embeddings else 'untied'} output embedding, "
        f"at most {m.max_positions} positions",
        f"- checkpoint: `{src.checkpoint.name}`, step {manifest['step']}, of run `{manifest['run']}`",
        f"- vocabularies: SentencePiece {c.vocab.type}, {manifest['vocab'][0]} {c.data.src_lang} and "
        f"{manifest['vocab'][1]} {c.data.tgt_lang} pieces",
        f"- generation_config.json: beam {d.beam}, length penalty {d.len_penalty}, at least {d.min_len} token(s); "
        f"nmt's own limit of {d.max_len_a}·source + {d.max_len_b} tokens has no counterpart (`max_new_tokens`)",
        "",
        "## Training data and licence",
        "",
        *data_lines(src.run_dir, c),
        "",
        "The model's own licence follows its training data's terms above; nmt (the code) is Apache-2.0.",
        "",
        "## Scores",
        "",
        *_scores(src.run_dir),
        "",
        "## What differs from `nmt translate`",
        "",
        *differences(c),
    ]
    return "\n".join(lines) + "\n"


def differences(config: Config) -> list[str]:
    """Markdown bullets: where this folder's tokenizer and decoding differ from nmt's."""
    data = config.data
    return [
        "- Pass-through spans are not masked: nmt replaces "
        + (", ".join(data.passthrough) or "no")
        + " spans by placeholders and restores them after decoding; here they reach the model as text.",
        "- Normalisation: NFKC"
        + " and Traditional→Simplified are" * (data.t2s and data.src_lang.startswith("zh"))
        + " compiled into source.spm (combining accents and 53 OpenCC phrases such as 乾隆 aside).",
        "- Length: no per-sentence limit (nmt: max_len_a·source + max_len_b); a source longer than "
        f"{config.model.max_positions - 1} pieces is not truncated unless `truncation=True` is passed.",
        "- `<unk>` in an output is dropped by `skip_special_tokens=True` (nmt writes ⁇).",
    ]


# --------------------------------------------------------------------------- export


def default_output(run_dir: Path, checkpoint: Path) -> Path:
    """<run>/export/hf-<checkpoint name>."""
    return RunDir(run_dir).export / f"hf-{Path(checkpoint).stem}"


def export_transformers(opts: ExportOptions, command: str | None = None) -> Path:
    """Write the transformers folder of `opts.run_dir`'s checkpoint (see the module docstring);
    `command` is what the model card says made it. Returns the folder's path."""
    require_transformers()
    if opts.quantization is not None:
        raise NmtError("--quantization: not for --format transformers (fp32 weights; quantize in transformers)")
    src = resolve_source(opts.run_dir, opts.checkpoint)
    check_exportable(src.config.model)
    out = Path(opts.output) if opts.output is not None else default_output(src.run_dir, src.checkpoint)
    if out.exists() and not (out / MANIFEST).is_file():
        raise NmtError(f"{out}: exists and is not an nmt export; choose another --output")
    if command is None:
        command = (
            f"nmt export --format transformers --run {shlex.quote(str(opts.run_dir))} --output {shlex.quote(str(out))}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        _write(src, tmp, command)
        replace_dir(tmp, out)
    except OSError as e:
        raise NmtError(f"{out}: cannot write ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write(src: ExportSource, out: Path, command: str) -> None:
    import sentencepiece as spm

    from nmt.run.checkpoints import checkpoint_step
    from nmt.run.weights import load_weights

    tf = require_transformers()
    cfg = src.config.model
    vocab = tuple(
        spm.SentencePieceProcessor(model_file=str(p)).get_piece_size() for p in (src.src_model, src.tgt_model)
    )
    state, _ = load_weights(src.checkpoint)
    converted = convert_state(state, cfg, *vocab)
    model = getattr(tf, hf_class(cfg))(hf_config(cfg, *vocab))
    expected = set(model.state_dict())
    if set(converted) != expected:
        missing, extra = sorted(expected - set(converted)), sorted(set(converted) - expected)
        raise NmtError(
            f"{hf_class(cfg)} of transformers {tf.__version__}: missing {missing[:3]}, unexpected {extra[:3]}"
        )
    model.load_state_dict(converted, strict=True)
    model.generation_config = generation_config(src.config)
    model.save_pretrained(str(out))
    write_tokenizer(src, out)
    manifest = {
        "format": "transformers",
        "class": hf_class(cfg),
        "run": str(src.run_dir.resolve()),
        "checkpoint": str(src.checkpoint.resolve()),
        "step": checkpoint_step(src.checkpoint),
        "vocab": list(vocab),
        "nmt_version": nmt.__version__,
        "transformers_version": tf.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command,
        "config": config_to_dict(src.config),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "README.md").write_text(model_card(src, manifest, command), encoding="utf-8")
