"""Typed experiment configuration: YAML in, validated dataclasses out.

Every stage receives these typed sections, never raw dicts. Loading fails with a
`ConfigError` (one line, naming the file and the dotted key, with a did-you-mean)
on an unknown key, a wrong type or an impossible value.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from nmt.config_values import build_section, parse_duration, suggest
from nmt.errors import ConfigError
from nmt.files import atomic_write_text

YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's safe loader where built: the same
# documents as yaml.safe_load, parsed in C (config reading is on the start-up path of every command)


# Span kinds that pass through translation unchanged (nmt/data/passthrough.py).
PASSTHROUGH_KINDS = ("latin", "number", "url", "email", "marked")


@dataclass
class BacktranslationConfig:
    """Synthetic pairs added to training (`nmt backtranslate` output), validation and test untouched."""

    corpus: str = ""  # a mirror directory with train.jsonl (real target side, synthetic source side)
    tag: bool = True  # mark synthetic sources with BT_TAG, a reserved piece of the source vocabulary
    real_upsample: int = 1  # real pairs written this many times (a real:synthetic ratio without dropping any)
    max_pairs: int | None = None  # use at most this many synthetic pairs (the first ones)
    # at most this many synthetic pairs per real line written (real_upsample copies count), drawn
    # uniformly (seeded): real data stays at least as large as synthetic by default; null = all
    ratio: float | None = 1.0
    # rules for synthetic pairs only (nmt/data/synthetic_filter.py), on top of the real-pair cleaning:
    max_ratio: float = 2.0  # scaled length ratio (nmt.data.clean.length_ratio), tighter than data.max_ratio
    max_char_run: int = 3  # a character (not a digit) more times in a row on the synthetic side; 0 = off
    max_token_share: float = 0.4  # the most frequent token's share of a synthetic side of 8+ tokens; 1 = off


@dataclass
class FilterConfig:
    """Noise filters for scraped pairs (`nmt.data.clean`), on top of the rules every pair goes
    through (empty, too_long, ratio, overlap); each drop is counted under its name in stats.json."""

    max_ratio: float | None = None  # this corpus's length-ratio limit (data.max_ratio's rule); null = data.max_ratio
    # the least share of each side's own script, in scaled length (a Han character 1, a Latin letter 1/3,
    # any other letter 1): Han on the Chinese side, Latin on the other; sides without letters pass; 0 = off
    script: float = 0.0
    identical: bool = False  # drop pairs whose two sides are the same text (case, spaces, punctuation aside)
    markup: bool = False  # drop pairs with a side that is only URLs, e-mail addresses, HTML tags/entities, punctuation
    near_dup: bool = False  # also drop pairs that repeat an earlier pair but for case, spaces and punctuation


@dataclass
class EvalSetEntry:
    """One more evaluation set of `data.eval_sets`: a split of a recipe (mirror or hub) or a local path."""

    corpus: str = ""  # a recipe name; its `split`
    split: Literal["valid", "test"] = "test"
    path: str = ""  # or a file / folder as data.test takes it
    name: str = ""  # the report name (eval/<name>.*); default <corpus>.<split> or the file's stem


@dataclass
class CorpusEntry:
    """One training corpus of `data.corpora`: a recipe name or a local path, and its weight."""

    corpus: str = ""  # a recipe name (its train split, from the mirror or the hub), or
    path: str = ""  # a folder laid out like a mirror folder (train.jsonl, train.zh + train.en, ...) or one file
    # each kept pair of this corpus is written this many times (upsampling); 1.5: every pair once,
    # and a seeded half of them (by pair hash) twice
    weight: float = 1.0
    filters: FilterConfig | None = None  # this corpus's noise filters; null = data.filters


BT_TAG = "⦅BT⦆"  # starts every tagged synthetic source (Caswell et al., 2019, "Tagged Back-Translation")


@dataclass
class DataConfig:
    corpus: str = "tatoeba"  # a recipe name (see nmt.data.recipes.RECIPES)
    mirror: str | None = None  # local directory in the HF translation schema
    # which way a run translates; everything follows it (vocab and model sides, training,
    # decoding, BLEU's tokenizer); T→S and NFKC apply to the Chinese side wherever it is
    direction: Literal["zh-en", "en-zh"] = "zh-en"
    max_train_pairs: int | None = None  # keep exactly this many train pairs, drawn uniformly (seeded), in order
    max_chars: int = 300  # drop pairs with a side longer than this (characters)
    max_ratio: float = 9.0  # drop pairs whose length ratio (chars, en/zh either way) exceeds this
    nfkc: bool = True  # Unicode NFKC normalisation (full-width ASCII → ASCII, etc.)
    t2s: bool = True  # Traditional → Simplified Chinese on the zh side (OpenCC)
    dedup: bool = True  # drop exact duplicate training pairs
    filter_overlap: bool = True  # drop training pairs whose zh or en side is in valid/test
    seed: int = 1
    # processes that clean the train split; 0 = every core this process may use. The corpus is
    # the same for any number (work is cut by the input, nmt/data/units.py), so it is not in the stamp.
    workers: int = 0
    # Span kinds copied verbatim through placeholders (nmt/data/passthrough.py); [] turns pass-through off.
    passthrough: list[str] = field(default_factory=lambda: list(PASSTHROUGH_KINDS))
    protected_terms: list[str] = field(default_factory=list)  # always passed through (case-sensitive)
    # the share of training pairs holding pass-through spans left unmasked (chosen by pair hash and
    # data.seed), so that the model also learns to copy names and numbers from raw text, as exported
    # models meet them (Argos, transformers); nmt's own runtimes still mask
    passthrough_unmasked: float = 0.0
    backtranslation: BacktranslationConfig | None = None  # {corpus: DIR, tag: true, ...}; null = real pairs only
    # training corpora, each [{corpus: NAME} or {path: DIR}, weight: N]; [] = the train split of data.corpus.
    # Valid and test still come from data.corpus (or data.valid / data.test); dedup spans all of them
    corpora: list[CorpusEntry] = field(default_factory=list)
    valid: str | None = None  # a local file instead of data.corpus's validation split (.jsonl, .tsv, or x.zh + x.en)
    test: str | None = None  # the same for the test split (e.g. newstest2019 for wmt19, docs/training-on-wmt.md)
    # more test sets, each [{corpus: NAME, split: test} or {path: FILE}]: copied into the corpus, guarded
    # against by the overlap filter like valid and test, and scored by the pipeline's eval stage after test
    eval_sets: list[EvalSetEntry] = field(default_factory=list)
    filters: FilterConfig = field(default_factory=FilterConfig)  # noise filters of every corpus without its own

    @property
    def src_lang(self) -> str:
        return self.direction.split("-")[0]

    @property
    def tgt_lang(self) -> str:
        return self.direction.split("-")[1]


# lower-case letters of Latin-1 and Latin Extended-A that names in an everyday corpus hold
# (Tatoeba's: "Timuçin", "Wienczysława", "Yaguatí"): what vocab.accented_pieces makes pieces and
# what copy examples may put in a made-up name (nmt.batches.copy_spans)
ACCENTED_LETTERS = "áàâäãåçéèêëíìîïñóòôöõøúùûüýÿłśźżćęąčšžřěőűğş"


@dataclass
class VocabConfig:
    type: Literal["unigram", "bpe"] = "unigram"
    src_size: int = 8000
    tgt_size: int = 8000
    # SentencePiece character coverage of each side; null = by language: 0.9995 for Chinese (rare
    # characters go to byte pieces), 1.0 otherwise
    src_coverage: float | None = None
    tgt_coverage: float | None = None
    byte_fallback: bool = True  # on the zh side; guarantees no <unk>
    # on the other side too (256 of its pieces become bytes): it can then write any letter a name
    # holds ("Timuçin", "Wienczysława") where its pieces lack it, and copy examples (train.copy_spans)
    # hold accented names; at 20 minutes it kept those names but fewer of the other held-out spans
    # (two seeds side by side, docs/benchmarks-log.md)
    byte_fallback_en: bool = False
    # every digit its own piece on both sides (SentencePiece's split_digits, as LLaMA's and PaLM's
    # vocabularies): "1955" is 1 9 5 5 wherever it stands, never "▁19" "5" "5" or "10" "0". With
    # copy examples and guided alignment a number is then copied one digit a piece on both sides, as
    # the copies spell it; on in configs/small.yaml and medium.yaml (BENCHMARKS, quality with real data)
    split_digits: bool = False
    # every printable ASCII character (letters, digits, punctuation) a piece of both vocabularies,
    # however rare in the sample (SentencePiece's required_chars). Without it a Chinese side keeps
    # only the Latin letters its text uses often enough for its character coverage (Tatoeba's: 9 of
    # the 26 lower-case letters), so a raw name is read partly as byte pieces ("Mary" as M a r <0x79>),
    # and an English side cannot write what its sample never held ("/", "@"): raw names, URLs and
    # addresses are then copied piece for piece as the copies (train.copy_spans) spell them. Three seeds
    # side by side at 20 minutes: valid BLEU +0.27 and raw-path spans up on average, but one seed lower
    # on every span set and its demo run lower: not in the recipes (docs/benchmarks-log.md)
    ascii_pieces: bool = False
    # every letter of ACCENTED_LETTERS, lower and upper case, a piece of both vocabularies the same
    # way: a raw "Timuçin" or "Yaguatí" can then be read and written whole, and copy examples
    # (train.copy_spans) give a share of their made-up names such a letter, as byte fallback on both
    # sides does (vocab.byte_fallback_en), without giving 256 English pieces to bytes. One seed side
    # by side: valid BLEU +0.48, the accented test names kept, news spans lower: off until more agree
    accented_pieces: bool = False
    # SentencePiece trains on a seeded sample of the train pairs (nmt/data/vocab_sample.py): the pairs of
    # smallest key up to this many characters per side. Its memory grows with this, not with the corpus:
    # about 50 bytes per character on the zh side and 25 on the en side, both sides at once (BENCHMARKS)
    sample_chars: int = 16_000_000
    max_sentences: int = 2_000_000  # and at most this many lines per side in that sample
    workers: int = 2  # processes used to encode the splits; with 2 or more the two sides train at once


@dataclass
class ModelConfig:
    d_model: int = 512
    heads: int = 8
    encoder_layers: int = 6
    decoder_layers: int = 6
    ffn_dim: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0  # on the attention weights
    activation_dropout: float = 0.0  # on the FFN's inner activations (model.dropout is on the residual branches)
    activation: Literal["relu", "gelu"] = "relu"
    norm: Literal["pre", "post"] = "pre"
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: int = 1024
    tie_embeddings: bool = True  # decoder input embedding = output projection
    attention: Literal["auto", "math", "sdpa", "flash"] = "auto"


@dataclass
class TrainConfig:
    max_tokens: int = 4096  # per batch, padded (src or tgt, whichever is larger)
    update_freq: int = 1  # gradient accumulation
    lr: float = 1e-3
    warmup: int = 1000
    # inverse_sqrt; cosine (to min_lr at max_steps); budget-linear / budget-cosine: to min_lr as the
    # train.max_time budget runs out, on the elapsed fraction of it after warm-up (nmt/train/objective.py)
    schedule: Literal["inverse_sqrt", "cosine", "budget-linear", "budget-cosine"] = "inverse_sqrt"
    min_lr: float = 0.0  # floor of the cosine and budget schedules
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    # regularisers for small data (0 = off each; nmt/train/regularisers.py, nmt/train/ema.py,
    # nmt/batches/subword_sampling.py), on training batches only, never validation or decoding.
    src_word_dropout: float = 0.0  # probability that a source piece is replaced by <unk>
    rdrop_alpha: float = 0.0  # R-Drop: weight of the symmetric KL between two dropout passes (2 forwards)
    # exponential moving average of the weights, updated after every update; when on, validation,
    # best/averaged/final checkpoints and export use it (raw weights kept for resume); e.g. 0.998
    ema_decay: float = 0.0
    # SentencePiece subword sampling of the training pairs (unigram vocab): re-encode each pair
    # with sampling, this alpha (smaller = more varied segmentations, e.g. 0.1-0.5)
    subword_alpha: float = 0.0
    # concatenation augmentation (nmt/batches/concat.py): this fraction of extra training pairs, each two
    # random pairs of the corpus joined (source after source, target after target), drawn once per run
    concat_pairs: float = 0.0
    # copy examples (nmt/batches/copy_spans.py), made once per run: each training pair that holds on both
    # sides a masked span or an aligned name/number (汤姆/Tom, 三/three) gives this many copies on
    # average, with a made-up name or number in its place, raw on both sides (the target spelling it
    # one character per piece): the model learns to copy what exported runtimes (no pass-through
    # masks) hand it; e.g. 1.0
    copy_spans: float = 0.0
    # the source embedding of each piece both vocabularies spell alike (letters, digits, punctuation,
    # placeholders) is the target's row while training (nmt/model/shared_rows.py), so that copying a
    # name or number letter by letter is what the vectors already say; the saved model is an ordinary one
    share_piece_embeddings: bool = False
    # guided alignment (nmt/train/alignment.py): one cross-attention head of the last decoder layer is
    # trained to look at the source letter, digit or placeholder each copied target piece copies, and
    # away from a copied run once it is written; this weight × that loss is added to the loss (the
    # log's "align": per copied piece); the saved model is an ordinary one; e.g. 1.0 with copy_spans
    guided_alignment: float = 0.0
    clip_norm: float = 1.0  # 0 disables clipping
    max_len: int = 256  # pairs with a longer side (in pieces) are skipped
    max_steps: int = 0  # 0 = no limit
    max_epochs: int = 0  # 0 = no limit
    # budget of training-loop wall time: updates, validation and checkpoint writes, summed over
    # resumed runs (not start-up, not the final validation after the stop; nmt/train/stopping.py),
    # e.g. "20m", "1h30m"; "" = no limit
    max_time: str = ""
    eval_every: int = 1000
    eval_sentences: int = 500  # fixed validation subset for BLEU during training
    patience: int = 0  # early stop after this many evals without BLEU gain; 0 = off
    log_every: int = 50
    keep_last: int = 5
    # auto = bf16 where the hardware has fast bf16 matmuls (CUDA with bf16, or a CPU with
    # AVX512-BF16/AMX), else fp32: emulated bf16 on an AVX2-only CPU is far slower (`nmt doctor`).
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # bf16 on a CPU: forward and backward on a bf16 copy of the weights, the optimizer on the fp32
    # master weights (nmt/train/weight_copy.py); false = autocast over the fp32 weights
    bf16_weight_copy: bool = True
    compile: bool = False
    threads: int = 0  # torch intra-op threads; 0 = all cores
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    max_nonfinite: int = 10  # abort after this many non-finite losses in a row
    seed: int = 1
    # fine-tuning: a trained checkpoint whose weights start this run (step 0, fresh optimizer and
    # schedule); its run's vocabularies are copied into this run (`nmt vocab`); "" = random init
    init_from: str = ""


@dataclass
class DecodeConfig:
    beam: int = 5
    nbest: int = 1
    len_penalty: float = 1.0  # fairseq-style: score / length**len_penalty
    max_len_a: float = 1.5  # max output length = a * src_len + b
    max_len_b: int = 10
    min_len: int = 1
    no_repeat_ngram: int = 0
    max_tokens: int = 6000  # source tokens per decoding batch
    batch_size: int = 64  # sentences per decoding batch (upper bound)


@dataclass
class Config:
    name: str = "default"
    data: DataConfig = field(default_factory=DataConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


SECTIONS = ("data", "vocab", "model", "train", "decode")


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Read a YAML config, apply `section.key=value` overrides, validate.

    The config's name defaults to the file's stem (`configs/small.yaml` → "small").
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=YAML_LOADER) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    raw.setdefault("name", path.stem)
    for item in overrides or []:
        apply_override(raw, item, source="--set")
    return config_from_dict(raw, source=str(path))


def apply_override(raw: dict, item: str, source: str = "--set") -> None:
    """Apply one `section.key=value` (or `section.sub.key=value`) override to a raw config dict;
    the value is parsed as YAML. Unknown keys are left for `config_from_dict` to name."""
    if "=" not in item:
        raise ConfigError(f"{source} {item!r}: expected section.key=value")
    dotted, value = item.split("=", 1)
    parts = dotted.strip().split(".")
    if len(parts) == 1 and parts[0] == "name":
        raw["name"] = value
        return
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"{source} {item!r}: expected section.key=value")
    if parts[0] not in SECTIONS:
        raise ConfigError(f"{source} {dotted}: unknown section {parts[0]!r}{suggest(parts[0], SECTIONS)}")
    node = raw
    for depth, name in enumerate(parts[:-1]):
        sub = node.get(name) or {}
        if not isinstance(sub, dict):
            where = ".".join(parts[: depth + 1])
            raise ConfigError(f"{source} {dotted}: {where!r} in the file is not a mapping")
        node[name] = node = sub
    try:
        node[parts[-1]] = yaml.load(value, Loader=YAML_LOADER) if value != "" else ""
    except yaml.YAMLError:
        node[parts[-1]] = value


def config_from_dict(raw: dict[str, Any], source: str = "<dict>") -> Config:
    """Build and validate a Config from a plain dict (as read from YAML)."""
    known = {f.name for f in dataclasses.fields(Config)}
    for key in raw:
        if key not in known:
            raise ConfigError(f"{source}: unknown section {key!r}{suggest(key, known)}")
    kwargs: dict[str, Any] = {"name": str(raw.get("name", "default"))}
    for section in SECTIONS:
        value = raw.get(section) or {}
        if section == "data" and isinstance(value, dict):
            value = _direction_from_languages(value, source)
            if value.get("corpora") and "corpus" not in value:  # else valid/test would quietly be tatoeba's
                raise ConfigError(f"{source}: data.corpora: also name data.corpus (its valid and test splits are used)")
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {section}: expected a mapping, got {type(value).__name__}")
        kwargs[section] = build_section(_SECTION_CLASSES[section], value, section, source)
    config = Config(**kwargs)
    validate(config, source)
    return config


def stamp_sections(config: Config) -> dict[str, dict]:
    """The config's sections as the stage stamps hash them (`nmt.run.stamps.hash_files`): settings
    spelled as before `data.direction`, `train.init_from`, by-language coverage and the required
    pieces (`vocab.ascii_pieces`, `accented_pieces`, while off) existed, so a run made before them
    stays fresh and is not redone. `data.workers` is left out: no output depends on it."""
    sections = config_to_dict(config)
    data = {k: v for k, v in sections["data"].items() if k not in ("direction", "workers")}
    data |= {"src_lang": config.data.src_lang, "tgt_lang": config.data.tgt_lang}
    vocab = {k: v for k, v in sections["vocab"].items() if k not in _REQUIRED_PIECES or v}  # off: as before them
    for side, lang in (("src", config.data.src_lang), ("tgt", config.data.tgt_lang)):
        if vocab[f"{side}_coverage"] is None:
            vocab[f"{side}_coverage"] = 0.9995 if lang == "zh" else 1.0
    train = {k: v for k, v in sections["train"].items() if k != "init_from" or v}
    data = {k: v for k, v in data.items() if k != "backtranslation" or v is not None}
    data = {
        k: v for k, v in data.items() if k not in ("corpora", "valid", "test", "eval_sets") or v
    }  # unset: as before
    if data.get("filters") == config_to_dict(Config())["data"]["filters"]:
        del data["filters"]  # off: spelled as before the filters existed
    if "corpora" in data:
        data["corpora"] = [{k: v for k, v in c.items() if k != "filters" or v is not None} for c in data["corpora"]]
    train = {k: v for k, v in train.items() if k not in _REGULARISERS or v}  # off: spelled as before they existed
    model = {k: v for k, v in sections["model"].items() if k != "activation_dropout" or v}
    return {**sections, "data": data, "vocab": vocab, "model": model, "train": train}


# 0 = off
_REQUIRED_PIECES = ("ascii_pieces", "accented_pieces")
_REGULARISERS = ("src_word_dropout", "rdrop_alpha", "ema_decay", "subword_alpha", "concat_pairs", "copy_spans")


def _direction_from_languages(data: dict, source: str) -> dict:
    """Configs written before `data.direction` named `src_lang`/`tgt_lang` (saved runs and
    checkpoints): read as the direction they describe."""
    if "src_lang" not in data and "tgt_lang" not in data:
        return data
    data = dict(data)
    direction = f"{data.pop('src_lang', 'zh')}-{data.pop('tgt_lang', 'en')}"
    if "direction" in data and data["direction"] != direction:
        raise ConfigError(f"{source}: data.direction {data['direction']!r} contradicts src_lang/tgt_lang ({direction})")
    if direction not in ("zh-en", "en-zh"):
        raise ConfigError(f"{source}: data.src_lang/tgt_lang {direction!r}: use data.direction: zh-en | en-zh")
    data["direction"] = direction
    return data


_SECTION_CLASSES = {
    "data": DataConfig,
    "vocab": VocabConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "decode": DecodeConfig,
}


# --------------------------------------------------------------------------- validation


Need = typing.Callable[[bool, str, str], None]  # need(ok, "section.key", message)


def validate(c: Config, source: str = "<config>") -> None:
    """Reject values that cannot work, naming the key (one section checker each)."""

    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            raise ConfigError(f"{source}: {key}: {msg}")

    bt = c.data.backtranslation
    if bt is not None:
        need(bool(bt.corpus), "data.backtranslation.corpus", "is empty (the directory `nmt backtranslate` wrote)")
        need(bt.real_upsample >= 1, "data.backtranslation.real_upsample", "must be >= 1")
        need(bt.max_pairs is None or bt.max_pairs >= 1, "data.backtranslation.max_pairs", "must be >= 1 or null")
        need(bt.ratio is None or bt.ratio > 0, "data.backtranslation.ratio", "must be > 0 or null")
        need(bt.max_ratio >= 1.0, "data.backtranslation.max_ratio", "must be >= 1")
        need(bt.max_char_run >= 0, "data.backtranslation.max_char_run", "must be >= 0 (0 = off)")
        need(0 < bt.max_token_share <= 1, "data.backtranslation.max_token_share", "must be in (0, 1]")

    _check_model(c.model, need)
    _check_vocab(c.vocab, need)
    _check_train(c.train, c.model, need)
    try:
        parse_duration(c.train.max_time)
    except ValueError as e:
        raise ConfigError(f"{source}: train.max_time: {e}") from None
    need(
        not c.train.schedule.startswith("budget-") or bool(c.train.max_time),
        "train.schedule",
        f"{c.train.schedule} decays over the time budget: set train.max_time (e.g. 20m)",
    )
    _check_decode(c.decode, need)
    _check_data(c.data, need)


def _check_model(m: ModelConfig, need: Need) -> None:
    need(m.d_model > 0, "model.d_model", "must be positive")
    need(m.heads > 0, "model.heads", "must be positive")
    need(m.d_model % max(m.heads, 1) == 0, "model.d_model", f"{m.d_model} is not divisible by model.heads={m.heads}")
    need(m.encoder_layers >= 1, "model.encoder_layers", "must be at least 1")
    need(m.decoder_layers >= 1, "model.decoder_layers", "must be at least 1")
    need(m.ffn_dim > 0, "model.ffn_dim", "must be positive")
    need(0.0 <= m.dropout < 1.0, "model.dropout", f"{m.dropout} is outside [0, 1)")
    need(0.0 <= m.attention_dropout < 1.0, "model.attention_dropout", f"{m.attention_dropout} is outside [0, 1)")
    need(0.0 <= m.activation_dropout < 1.0, "model.activation_dropout", f"{m.activation_dropout} is outside [0, 1)")
    need(m.max_positions > 0, "model.max_positions", "must be positive")


def _check_vocab(v: VocabConfig, need: Need) -> None:
    need(v.src_size >= 16, "vocab.src_size", "must be at least 16")
    need(v.tgt_size >= 16, "vocab.tgt_size", "must be at least 16")
    need(v.src_coverage is None or 0.9 <= v.src_coverage <= 1.0, "vocab.src_coverage", "must be in [0.9, 1]")
    need(v.tgt_coverage is None or 0.9 <= v.tgt_coverage <= 1.0, "vocab.tgt_coverage", "must be in [0.9, 1]")
    need(v.workers >= 1, "vocab.workers", "must be at least 1")
    need(v.sample_chars >= 1, "vocab.sample_chars", "must be at least 1")
    need(v.max_sentences >= 1, "vocab.max_sentences", "must be at least 1")


def _check_train(t: TrainConfig, m: ModelConfig, need: Need) -> None:
    need(t.max_tokens > 0, "train.max_tokens", "must be positive")
    need(t.update_freq >= 1, "train.update_freq", "must be at least 1")
    need(t.lr > 0, "train.lr", "must be positive")
    need(t.warmup >= 0, "train.warmup", "must be >= 0")
    need(all(0.0 <= b < 1.0 for b in t.betas), "train.betas", "each beta must be in [0, 1)")
    need(0.0 <= t.label_smoothing < 1.0, "train.label_smoothing", "must be in [0, 1)")
    need(t.clip_norm >= 0, "train.clip_norm", "must be >= 0")
    need(0.0 <= t.src_word_dropout < 1.0, "train.src_word_dropout", f"{t.src_word_dropout} is outside [0, 1)")
    need(t.rdrop_alpha >= 0, "train.rdrop_alpha", "must be >= 0")
    need(0.0 <= t.concat_pairs <= 1.0, "train.concat_pairs", f"{t.concat_pairs} is outside [0, 1] (0 = off)")
    need(0.0 <= t.ema_decay < 1.0, "train.ema_decay", f"{t.ema_decay} is outside [0, 1) (0 = off)")
    need(0.0 <= t.subword_alpha <= 1.0, "train.subword_alpha", f"{t.subword_alpha} is outside [0, 1] (0 = off)")
    need(0.0 <= t.copy_spans <= 16.0, "train.copy_spans", f"{t.copy_spans} is outside [0, 16] (0 = off)")
    need(t.guided_alignment >= 0, "train.guided_alignment", f"{t.guided_alignment} must be >= 0 (0 = off)")
    need(t.max_len >= 2, "train.max_len", "must be at least 2")
    need(
        t.max_len < m.max_positions,
        "train.max_len",
        f"{t.max_len} must be below model.max_positions={m.max_positions} (BOS/EOS take one position)",
    )
    need(t.max_steps >= 0 and t.max_epochs >= 0, "train.max_steps", "limits must be >= 0")
    need(t.eval_every > 0, "train.eval_every", "must be positive")
    need(t.log_every > 0, "train.log_every", "must be positive")
    need(t.keep_last >= 1, "train.keep_last", "must be at least 1")
    need(t.threads >= 0, "train.threads", "must be >= 0")
    need(t.max_nonfinite >= 1, "train.max_nonfinite", "must be at least 1")


def _check_decode(d: DecodeConfig, need: Need) -> None:
    need(d.beam >= 1, "decode.beam", "must be at least 1")
    need(1 <= d.nbest <= d.beam, "decode.nbest", f"must be between 1 and decode.beam={d.beam}")
    need(d.max_len_a >= 0 and d.max_len_b >= 0, "decode.max_len_a", "length limits must be >= 0")
    need(d.min_len >= 0, "decode.min_len", "must be >= 0")
    need(d.no_repeat_ngram >= 0, "decode.no_repeat_ngram", "must be >= 0")
    need(d.max_tokens > 0 and d.batch_size > 0, "decode.max_tokens", "batch limits must be positive")


def _check_data(data: DataConfig, need: Need) -> None:
    need(data.max_chars > 0, "data.max_chars", "must be positive")
    need(data.max_ratio >= 1.0, "data.max_ratio", "must be >= 1")
    need(data.max_train_pairs is None or data.max_train_pairs > 0, "data.max_train_pairs", "must be positive")
    need(data.workers >= 0, "data.workers", "must be >= 0 (0 = every core)")
    for kind in data.passthrough:
        need(kind in PASSTHROUGH_KINDS, "data.passthrough", f"unknown kind {kind!r}{suggest(kind, PASSTHROUGH_KINDS)}")
    for term in data.protected_terms:
        need(term.strip() == term != "" and "\n" not in term, "data.protected_terms", f"{term!r}: blank or padded term")
    need(0.0 <= data.passthrough_unmasked <= 1.0, "data.passthrough_unmasked", "must be in [0, 1]")
    _check_corpora(data, need)
    # Host-dependent needs (flash attention needs CUDA) are checked where the model runs
    # (nmt.model.attention.resolve_backend), not here: a run trained on a GPU must load anywhere.


def _check_corpora(data: DataConfig, need: Need) -> None:
    """Each `data.corpora` entry names a recipe or a path (not both) and a weight >= 1. Recipe
    names are checked where the recipes live, as `data.corpus`'s are (`nmt.data.recipes.get_recipe`,
    when the corpus is prepared, before any work)."""
    for i, entry in enumerate(data.corpora):
        key = f"data.corpora[{i}]"
        need(bool(entry.corpus) != bool(entry.path), key, "give either corpus: NAME or path: DIR")
        need(entry.weight >= 1, f"{key}.weight", f"{entry.weight} must be at least 1")
        if entry.filters is not None:
            _check_filters(entry.filters, f"{key}.filters", need)
    _check_filters(data.filters, "data.filters", need)
    names = []
    for i, entry in enumerate(data.eval_sets):
        key = f"data.eval_sets[{i}]"
        need(bool(entry.corpus) != bool(entry.path), key, "give either corpus: NAME or path: FILE")
        names.append(eval_set_name(entry))
        need(names[-1] not in names[:-1], f"{key}.name", f"{names[-1]!r} names another set too: give each its own")
        need(names[-1] not in ("train", "valid", "test"), f"{key}.name", f"{names[-1]!r} is a split of the run")
    for key in ("valid", "test"):
        need(getattr(data, key) != "", f"data.{key}", "is empty (a file path, or null for data.corpus's split)")


def _check_filters(f: FilterConfig, key: str, need: Need) -> None:
    need(f.max_ratio is None or f.max_ratio >= 1.0, f"{key}.max_ratio", "must be >= 1 or null")
    need(0.0 <= f.script <= 1.0, f"{key}.script", f"{f.script} is outside [0, 1] (0 = off)")


def eval_set_name(entry: EvalSetEntry) -> str:
    """The report name of a `data.eval_sets` entry: its own, `<corpus>.<split>`, or the file's stem."""
    if entry.name:
        return entry.name
    if entry.corpus:
        return f"{entry.corpus}.{entry.split}"
    return Path(entry.path).name.split(".")[0]


# --------------------------------------------------------------------------- saving


def config_to_dict(c: Config) -> dict[str, Any]:
    """Plain dict (tuples as lists) suitable for YAML/JSON."""

    def plain(x: Any) -> Any:
        if isinstance(x, tuple):
            return list(x)
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x

    return plain(dataclasses.asdict(c))


def config_to_yaml(c: Config) -> str:
    return yaml.safe_dump(config_to_dict(c), sort_keys=False, allow_unicode=True)


def save_config(c: Config, path: str | Path) -> None:
    """Write the resolved config atomically."""
    atomic_write_text(Path(path), config_to_yaml(c))
