"""Translator: normalisation, blank and over-long lines, length-sorted batching, loading a run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nmt import BOS_ID, EOS_ID, PAD_ID
from nmt.config import config_to_yaml, load_config, save_config

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- a tiny run directory


def _jsonl(path: Path, n: int | None = None) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line)["translation"] for line in f]
    return rows[:n] if n else rows


def _train_spm(text: list[str], prefix: Path, size: int, byte_fallback: bool) -> None:
    import sentencepiece as spm

    src = prefix.with_suffix(".txt")
    src.write_text("\n".join(text) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(src),
        model_prefix=str(prefix),
        vocab_size=size,
        character_coverage=0.98 if byte_fallback else 1.0,
        byte_fallback=byte_fallback,
        pad_id=PAD_ID,
        unk_id=1,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        normalization_rule_name="identity",
        hard_vocab_limit=False,
        minloglevel=2,
        num_threads=1,
    )
    src.unlink()


def tatoeba_test_pairs(shared: Path, per_code: int = 12) -> tuple[list[dict], list[str]]:
    """The first `per_code` Simplified and Traditional rows of the real Tatoeba test set."""
    rows = _jsonl(shared / "tatoeba-zh-en" / "test.jsonl")
    codes = (shared / "tatoeba-zh-en" / "test.codes.txt").read_text(encoding="utf-8").split("\n")
    picked: list[int] = []
    for code in ("cmn_Hans", "cmn_Hant"):
        picked += [i for i, c in enumerate(codes[: len(rows)]) if c == code][:per_code]
    return [rows[i] for i in picked], [codes[i] for i in picked]


def synthetic_test_pairs(per_code: int = 12, seed: int = 7) -> tuple[list[dict], list[str]]:
    """`per_code` Simplified then `per_code` Traditional pairs of tests/synthetic.py, as tatoeba_test_pairs."""
    from synthetic import pairs, script_code

    rows = pairs(20 * per_code, seed=seed, traditional=0.5)
    picked = [[{"zh": z, "en": e} for z, e in rows if script_code(z) == code][:per_code] for code in CODES]
    return picked[0] + picked[1], [CODES[0]] * per_code + [CODES[1]] * per_code


CODES = ("cmn_Hans", "cmn_Hant")


def make_tiny_run(root: Path, shared: Path | None = None) -> Path:
    """A run dir as the pipeline leaves it: config, vocab, corpus/test.*, a random-init final checkpoint.

    Text from tests/synthetic.py, or from the real mirror `shared` when given."""
    import sentencepiece as spm
    from safetensors.torch import save_file

    from nmt.data.normalize import normalize_source, normalize_target
    from nmt.model.transformer import build_model

    config = load_config(
        ROOT / "configs" / "tiny.yaml",
        ["model.max_positions=24", "train.max_len=16", "decode.batch_size=4", "decode.max_tokens=60"],
    )
    run = root / "run"
    (run / "vocab").mkdir(parents=True)
    if shared is None:
        from synthetic import vocab_pairs

        train = [{"zh": z, "en": e} for z, e in vocab_pairs(300)]
        pairs, codes = synthetic_test_pairs()
    else:
        train = _jsonl(shared / "tatoeba-zh-en" / "train.jsonl", 300)
        pairs, codes = tatoeba_test_pairs(shared)
    _train_spm([normalize_source(p["zh"], config.data) for p in train], run / "vocab" / "zh", 1500, True)
    _train_spm([normalize_target(p["en"], config.data) for p in train], run / "vocab" / "en", 500, False)
    corpus = run / "corpus"
    corpus.mkdir()
    for name, lines in (("test.zh", [p["zh"] for p in pairs]), ("test.en", [p["en"] for p in pairs])):
        (corpus / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    (corpus / "test.codes").write_text("".join(c + "\n" for c in codes), encoding="utf-8")
    save_config(config, run / "config.yaml")
    torch.manual_seed(0)
    sizes = [
        spm.SentencePieceProcessor(model_file=str(run / "vocab" / f"{s}.model")).get_piece_size() for s in ("zh", "en")
    ]
    model = build_model(config, sizes[0], sizes[1])
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    (run / "checkpoints").mkdir()
    save_file(state, str(run / "checkpoints" / "final.safetensors"), {"config": config_to_yaml(config), "step": "0"})
    return run


@pytest.fixture(scope="module")
def tiny_run_dir(tmp_path_factory, request) -> Path:
    return make_tiny_run(tmp_path_factory.mktemp("translate"))


# --------------------------------------------------------------------------- a model whose output is its input


class _CopyState:
    def __init__(self, src: torch.Tensor):
        self.src, self.step = src, 0  # (R, S)

    def reorder(self, index: torch.Tensor, sentences: torch.Tensor | None = None, beam: int | None = None) -> None:
        self.src = self.src.index_select(0, index)  # every row keeps its own source


class CopyModel:
    """Emits its source (ids shifted into the target vocabulary), then EOS; counts the rows it decodes."""

    def __init__(self, tgt_vocab: int, max_positions: int = 24):
        self.tgt_vocab, self.max_positions, self.rows_seen = tgt_vocab, max_positions, 0

    def to(self, device):  # Translator moves its model
        return self

    def eval(self):
        return self

    def encode(self, src: torch.Tensor) -> SimpleNamespace:
        self.rows_seen += src.size(0)
        return SimpleNamespace(memory=src, src_pad=src == PAD_ID)

    def start_decoding(self, enc: SimpleNamespace) -> _CopyState:
        return _CopyState(enc.memory)

    def decode_step(self, tokens: torch.Tensor, state: _CopyState) -> torch.Tensor:
        src = state.src
        nxt = src[:, state.step] if state.step < src.size(1) else torch.full_like(src[:, 0], EOS_ID)
        nxt = torch.where(nxt > EOS_ID, 4 + (nxt - 4) % (self.tgt_vocab - 4), nxt)
        nxt = torch.where(nxt == PAD_ID, torch.full_like(nxt, EOS_ID), nxt)
        state.step += 1
        return torch.nn.functional.one_hot(nxt, self.tgt_vocab).float() * 20.0  # (R, V)

    def copied(self, ids: list[int]) -> list[int]:
        """The target ids this model emits for source pieces `ids`."""
        return [4 + (i - 4) % (self.tgt_vocab - 4) if i > EOS_ID else i for i in ids]


@pytest.fixture
def copy_translator(tiny_run_dir):
    from nmt.data.tokenizer import load_tokenizers
    from nmt.decode.translator import Translator

    config = load_config(tiny_run_dir / "config.yaml")
    src_tok, tgt_tok = load_tokenizers(tiny_run_dir, config)
    return Translator(CopyModel(tgt_tok.vocab_size), src_tok, tgt_tok, config)


LINES = [
    "我们在这里。",
    "汤姆想知道玛丽为什么哭了。",
    "你好!",
    "他昨天晚上没有睡觉,因为他要准备考试。",
    "猫在桌子上。",
    "我不知道。",
    "这本书是我的。",
]


# --------------------------------------------------------------------------- tests


def test_output_in_input_order_with_sorted_batches(copy_translator):
    t = copy_translator
    ids = t.encode_sources(LINES)
    groups = t.batches(ids)
    assert len(groups) > 1  # decode.batch_size=4 forces several batches
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(len(LINES)))
    assert [len(ids[i]) for i in flat] == sorted((len(s) for s in ids), reverse=True)
    d = t.config.decode
    for g in groups:
        assert len(g) <= d.batch_size and len(g) * (len(ids[g[0]]) + 1) <= d.max_tokens
    together = t.translate(LINES, beam=2)
    alone = [t.translate([line], beam=2)[0] for line in LINES]
    assert together == alone
    assert len(set(together)) == len(LINES)  # distinct inputs, distinct outputs: order is checkable
    for line, out in zip(LINES, together, strict=True):  # the copy model returns the source pieces
        expect = t.tgt_tok.decode(t.model.copied(t.encode_sources([line])[0]))
        assert out == expect


def test_stream_chunks_keep_order(copy_translator):
    lines = [f"{line}\n" for line in LINES * 3]
    streamed = list(copy_translator.translate_stream(iter(lines), beam=1, chunk_lines=4))
    assert streamed == copy_translator.translate([line.rstrip("\n") for line in lines], beam=1)


def test_blank_lines_skip_the_model(copy_translator):
    t = copy_translator
    out = t.translate(["", "我们在这里。", "   ", ""], beam=2)
    assert out[0] == out[2] == out[3] == ""
    assert out[1] != ""
    assert t.model.rows_seen == 1 and t.stats.sentences == 1


def test_long_line_truncated_with_warning(copy_translator, capsys):
    t = copy_translator
    long = "".join(LINES * 4)
    assert len(t.encode_sources([long])[0]) == t.max_src_pieces == 23
    err = capsys.readouterr().err
    assert "line 1:" in err and "truncated to 23" in err
    out = t.translate(["猫在桌子上。", long, "", long], beam=1)
    err = capsys.readouterr().err
    assert "line 2:" in err and "line 4:" in err and "line 1:" not in err
    assert err.count("truncated") == 2
    assert out[1] == out[3] != ""


def test_traditional_input_normalised_like_training(copy_translator):
    t = copy_translator
    trad, simp = "我們在這裡。", "我们在这里。"
    assert t.encode_sources([trad]) == t.encode_sources([simp])
    assert t.translate([trad]) == t.translate([simp])
    t.config.data.t2s = False  # the test can fail: without t2s the pieces differ
    assert t.encode_sources([trad]) != t.encode_sources([simp])


def test_nbest(copy_translator):
    t = copy_translator
    nb = t.translate_nbest(["猫在桌子上。", ""], beam=3, nbest=3)
    assert nb[1] == []
    scores = [s for _, s in nb[0]]
    assert len(nb[0]) >= 1 and scores == sorted(scores, reverse=True)
    joined = t.translate(["猫在桌子上。"], beam=3, nbest=3)[0]
    assert joined.split("\n") == [f"{score:.4f}\t{text}" for text, score in nb[0]]  # score<TAB>text, best first
    assert t.translate([""], beam=3, nbest=3)[0].split("\n") == ["nan\t"] * 3  # K lines for every input
    heard: dict[int, list] = {}
    lines = ["猫在桌子上。", "", "我们九点见。"]
    found = t.translate_nbest(lines, beam=3, nbest=2, on_line=lambda i, pairs: heard.setdefault(i, pairs))
    assert heard == {0: found[0], 2: found[2]}  # each decoded line heard once, as returned


def test_from_run_loads_the_checkpoint(tiny_run_dir):
    from nmt.decode.translator import Translator

    t = Translator.from_run(tiny_run_dir, device="cpu")
    assert t.checkpoint == tiny_run_dir / "checkpoints" / "final.safetensors"
    out = t.translate(LINES[:3] + [""], beam=2)
    assert len(out) == 4 and out[3] == ""
    assert all(isinstance(o, str) for o in out)
    assert all(x not in o for o in out for x in ("<s>", "</s>", "<pad>"))
    assert t.translate(LINES[:3], beam=1) == [t.translate([line], beam=1)[0] for line in LINES[:3]]


@pytest.mark.precision
@pytest.mark.int8
@pytest.mark.parametrize("precision", ["auto", "fp32", "bf16", "int8"])
def test_from_run_in_every_precision(tiny_run_dir, precision):
    from nmt.decode.translator import Translator

    t = Translator.from_run(tiny_run_dir, device="cpu", precision=precision)
    assert t.precision == ("fp32" if precision == "auto" else precision)  # auto: the reference, never measured
    together = t.translate(LINES[:4], beam=2)
    assert len(together) == 4 and together == [t.translate([line], beam=2)[0] for line in LINES[:4]]  # batch-invariant


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.slow
def test_the_engines_fast_decoder_translates_as_the_reference_step(tiny_run, precision):
    """Whole translations (n-best texts with their scores) through the engine's FastDecoder equal
    those of the reference step (`Transformer.decode_step`), greedy and beam, one sentence at a
    time and in batches of 3 and 16, with pass-through spans (a URL, numbers, an e-mail)."""
    from nmt.decode.translator import Translator
    from nmt.model.fast_decoder import FastDecoder

    t = Translator.from_run(tiny_run, device="cpu", precision=precision, rows=1)
    assert isinstance(t.engine.stepper, FastDecoder) and t.masker is not None  # spans are masked
    lines = [*LINES[:5], "访问 https://example.org/a?b=1 或写信给 a.b@example.com。", "2024年有 366 天。"]
    found = {}
    for stepper in (t.engine.stepper, t.engine.model):
        t.engine.stepper = stepper
        for batch in (1, 3, 16):
            t.config.decode.batch_size = batch
            for beam, nbest in ((1, 1), (3, 2)):
                found.setdefault(id(stepper), []).append(t.translate(lines, beam=beam, nbest=nbest))
    fast, reference = found.values()
    assert fast == reference and any("example.org" in line for line in fast[0])


def test_a_run_trained_with_flash_translates_and_averages_on_cpu(tiny_run_dir, tmp_path, monkeypatch):
    """A run whose stored configs say `model.attention: flash` (trained on a GPU) on a CPU machine."""
    import shutil

    from nmt.config import save_config
    from nmt.decode.translator import Translator
    from nmt.model.transformer import build_model
    from nmt.run import weights as ckpt

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run = tmp_path / "gpu-run"
    shutil.copytree(tiny_run_dir / "vocab", run / "vocab")
    state, config = ckpt.load_weights(tiny_run_dir / "checkpoints" / "final.safetensors")
    config.model.attention = "flash"
    save_config(config, run / "config.yaml")
    model = build_model(config, *(state[k].size(0) for k in ("src_embed.weight", "tgt_embed.weight")))
    model.load_state_dict(state)  # a flash model builds anywhere; only running it needs CUDA
    for step in (1, 2):
        ckpt.save_checkpoint(run / "checkpoints", step, model, {}, config, keep_last=5)
    averaged = ckpt.average_last(run, 2).path
    assert ckpt.load_weights(averaged)[1].model.attention == "flash"
    t = Translator.from_run(run, checkpoint=averaged, device="cpu", precision="fp32")
    reference = Translator.from_run(tiny_run_dir, device="cpu", precision="fp32")
    assert t.translate(LINES[:3], beam=2) == reference.translate(LINES[:3], beam=2)


def test_from_run_errors(tiny_run_dir, tmp_path):
    from nmt.decode.translator import Translator
    from nmt.errors import NmtError

    with pytest.raises(NmtError, match="no checkpoint"):
        Translator.from_run(tmp_path)
    with pytest.raises(NmtError, match="not found"):
        Translator.from_run(tiny_run_dir, checkpoint=tmp_path / "missing.safetensors")
    with pytest.raises(TypeError, match=r"from_run\(\) got beam: pass it to translate\(\)"):
        Translator.from_run(tiny_run_dir, device="cpu", beam=3)  # a loader would silently drop it
    with pytest.raises(TypeError, match="unexpected keyword argument 'devise'"):
        Translator.from_run(tiny_run_dir, devise="cpu")  # InferenceOptions names every option


def test_translate_to_file(tiny_run_dir, tmp_path):
    from nmt.decode.options import InferenceOptions
    from nmt.decode.translator import translate_to

    src = tmp_path / "in.zh"
    src.write_text("我们在这里。\n\n猫在桌子上。\n", encoding="utf-8")
    out = tmp_path / "out.en"
    n = translate_to(InferenceOptions(run_dir=tiny_run_dir, device="cpu", beam=2), input_path=src, output_path=out)
    lines = out.read_text(encoding="utf-8").split("\n")
    assert n == 3 and len(lines) == 4 and lines[1] == "" and lines[3] == ""


# --------------------------------------------------------------------------- pass-through spans (no real data needed)


class _CharTok:
    """A tokenizer of single characters plus the pass-through placeholders as whole pieces."""

    def __init__(self, placeholders: bool = True):
        from nmt.data.passthrough import PLACEHOLDERS

        self.pieces = ["<pad>", "<unk>", "<s>", "</s>", *(PLACEHOLDERS if placeholders else ())]
        self.pattern = re.compile("|".join(map(re.escape, self.pieces[4:])) + "|." if placeholders else ".", re.S)
        self.vocab_size = 200

    def _id(self, piece: str) -> int:
        if piece not in self.pieces:
            self.pieces.append(piece)
        return self.pieces.index(piece)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[self._id(p) for p in self.pattern.findall(t)] for t in texts]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)

    def has_pieces(self, pieces) -> bool:
        return all(p in self.pieces for p in pieces)


class _ScriptedEngine:
    """Answers each (masked) source with a scripted output text: the model's mistakes on demand."""

    name, device, precision = "scripted", torch.device("cpu"), "fp32"

    def __init__(self, tok: _CharTok, script: dict[str, str]):
        self.tok, self.script, self.seen = tok, script, []

    def search(self, seqs, beam, nbest, len_penalty, greedy, on_done=None):
        out = []
        for s in seqs:
            self.seen.append(self.tok.decode(s))
            out.append([(self.tok.encode_batch([self.script[self.seen[-1]]])[0], 0.0)] * nbest)
        return out


def _scripted(script: dict[str, str], placeholders: bool = True):
    from nmt.config import config_from_dict
    from nmt.decode.translator import Translator

    tok = _CharTok(placeholders)
    config = config_from_dict({"data": {"t2s": False}, "decode": {"beam": 2}})
    return Translator(None, tok, tok, config, engine=_ScriptedEngine(tok, script))


def test_spans_are_masked_for_the_model_and_restored_from_every_mistake():
    from nmt.data.passthrough import CLOSE, OPEN, PLACEHOLDERS

    p = PLACEHOLDERS
    script = {
        f"我爱 {p[0]}": f"I love {p[0]}.",  # copied
        f"{p[0]}在{p[1]}年发布": "It was released.",  # both dropped: appended
        f"访问{p[0]},谢谢。": f"Visit {p[0]} {p[0]} {p[3]}, thanks.",  # repeated and invented
        f"用{p[0]}发邮件": f"Mail {OPEN}{p[0]}{CLOSE}",  # stray placeholder fragments
        "你好": f"Hello {p[5]}",  # invented in a sentence without spans
    }
    t = _scripted(script)
    lines = [
        "我爱 AI",
        "iPhone15在２０２４年发布",
        "访问https://example.org/x，谢谢。",
        "用`tom@example.com`发邮件",
        "你好",
    ]
    out = t.translate(lines)
    assert out == [
        "I love AI.",
        "It was released iPhone15 2024.",
        "Visit https://example.org/x, thanks.",
        "Mail tom@example.com",
        "Hello",
    ]
    assert set(t.engine.seen) == set(script)  # the model saw placeholders, never the spans
    nbest = t.translate_nbest(lines[:1], beam=2, nbest=2)[0]
    assert [text for text, _ in nbest] == ["I love AI."] * 2
    assert not any(OPEN in o or CLOSE in o for o in out)


def test_vocabulary_without_placeholders_is_not_masked():
    t = _scripted({"我爱 AI": "I love AI."}, placeholders=False)  # a run trained before pass-through
    assert t.masker is None and t.translate(["我爱 AI"]) == ["I love AI."]


def test_translate_input_file_with_a_bom(tmp_path, monkeypatch):
    """`nmt translate --input` on a file saved with a UTF-8 BOM: the model never sees U+FEFF."""
    import nmt.decode.translator as tr

    seen: list[str] = []

    class Recorder:
        def translate_stream(self, lines, beam, nbest, len_penalty, *args):
            for line in lines:
                seen.append(line)
                yield line.strip()

    monkeypatch.setattr(tr.Translator, "from_options", classmethod(lambda cls, opts: Recorder()))
    src, out = tmp_path / "in.zh", tmp_path / "out.en"
    src.write_bytes("\ufeff".encode() + "你好。\n我爱你。\n".encode())
    assert tr.translate_to(tr.InferenceOptions(run_dir=tmp_path), input_path=src, output_path=out) == 2
    assert [line.rstrip("\n") for line in seen] == ["你好。", "我爱你。"]
    assert out.read_text(encoding="utf-8") == "你好。\n我爱你。\n"


def test_native_translate_imports_no_compiler_stack(tiny_run_dir):
    """`nmt translate --engine native` imports PyTorch but not torch._dynamo (seconds of start-up;
    a meta-device model build pulled it in once): `python -X importtime` lists every module."""
    import subprocess
    import sys

    cmd = [sys.executable, "-X", "importtime", "-m", "nmt", "translate", "--run", str(tiny_run_dir)]
    done = subprocess.run([*cmd, "--engine", "native", "--precision", "fp32", "你好。"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert "torch" in imported  # the listing is real
    assert not {m for m in imported if m.startswith("torch._dynamo")}, "the native path imported torch._dynamo"
    assert "pydantic" not in imported, "typer >= 0.29 imports pydantic on every command (pyproject.toml pins below)"


def test_the_loaded_line_says_how_the_native_engine_decodes(tiny_run_dir, capsys):
    from nmt.decode.translator import Translator
    from nmt.model.convert import int8_kernels

    Translator.from_run(tiny_run_dir, device="cpu", precision="fp32")
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("; native fp32")
    if int8_kernels():
        t = Translator.from_run(tiny_run_dir, device="cpu", precision="int8", rows=1)
        kernel = next(m.kernel for m in t.model.modules() if hasattr(m, "kernel"))
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"; native int8 ({kernel})")
