"""sacreBLEU scoring, per-code scores, the evaluation report files, and input checks."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import sacrebleu
import torch
from test_translator import make_tiny_run, synthetic_test_pairs, tatoeba_test_pairs

from nmt.config import load_config
from nmt.decode.evaluate import EvalJob, evaluate_run, read_lines, score, score_by_code
from nmt.decode.options import InferenceOptions
from nmt.decode.translator import DecodeStats
from nmt.errors import NmtError

pytestmark = pytest.mark.usefixtures("one_thread")


def _degrade(text: str, i: int) -> str:
    """A deterministic imperfect 'translation' of a reference."""
    words = text.split()
    if i % 3 == 0:
        return " ".join(words[:-1])
    if i % 3 == 1:
        return " ".join(reversed(words))
    return text.lower()


@pytest.fixture(scope="module", params=["synthetic", pytest.param("real", marks=pytest.mark.real_data)])
def real_refs(request) -> tuple[list[str], list[str], list[str]]:
    """40 Simplified + 40 Traditional references (generated, and from the real mirror where present)
    with deterministic imperfect hypotheses."""
    from conftest import SHARED_DATA

    if request.param == "synthetic":
        pairs, codes = synthetic_test_pairs(per_code=40)
    elif (SHARED_DATA / "tatoeba-zh-en" / "test.jsonl").is_file():
        pairs, codes = tatoeba_test_pairs(SHARED_DATA, per_code=40)
    else:
        pytest.skip(f"real corpus mirror not found at {SHARED_DATA}")
    refs = [p["en"] for p in pairs]
    return refs, [_degrade(r, i) for i, r in enumerate(refs)], codes


# --------------------------------------------------------------------------- score


def test_score_equals_sacrebleu(real_refs):
    refs, hyps, _ = real_refs
    got = score(hyps, refs)
    assert got["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert got["bleu"] == sacrebleu.metrics.BLEU().corpus_score(hyps, [refs]).score
    assert got["chrf"] == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert 10 < got["bleu"] < 90 and 10 < got["chrf"] < 95
    assert "tok:13a" in got["bleu_signature"] and "nrefs:1" in got["bleu_signature"]
    assert "version:" in got["bleu_signature"] and "nc:6" in got["chrf_signature"]
    assert got["sentences"] == len(refs) and got["bleu_detail"].startswith("BLEU = ")
    assert "ter" not in got
    with_ter = score(hyps, refs, ter=True)
    assert with_ter["ter"] == sacrebleu.corpus_ter(hyps, [refs]).score and "ter_signature" in with_ter


def test_chinese_references_are_scored_as_the_model_learnt_to_write():
    """An en→zh model trained on Simplified, NFKC targets is scored against references normalised
    the same way (a correct translation of a Traditional line is not counted wrong); English
    references stay raw."""
    from nmt.config import DataConfig
    from nmt.decode.evaluate import scoring_references

    refs = ["我吃飽了。", "這是我的書，ＯＫ？"]
    got, how = scoring_references(refs, DataConfig(direction="en-zh"))
    assert got == ["我吃饱了。", "这是我的书,OK?"] and "Traditional→Simplified" in how and "NFKC" in how
    assert scoring_references(refs, DataConfig(direction="en-zh", t2s=False, nfkc=False)) == (refs, "raw")
    english = ["Ｉt's  fine."]
    assert scoring_references(english, DataConfig(direction="zh-en")) == (english, "raw")
    hyps = ["我吃饱了。", "这是我的书,OK?"]
    assert score(hyps, got, tgt_lang="zh")["bleu"] == pytest.approx(100.0)
    assert score(hyps, refs, tgt_lang="zh")["bleu"] < 60


def test_score_chinese_target_uses_zh_tokenizer():
    refs = ["我们在这里等你。", "猫在桌子上睡觉。"]
    hyps = ["我们在这里等。", "猫在桌子上。"]
    got = score(hyps, refs, tgt_lang="zh")
    assert "tok:zh" in got["bleu_signature"]
    assert got["bleu"] == pytest.approx(sacrebleu.metrics.BLEU(tokenize="zh").corpus_score(hyps, [refs]).score)
    assert got["bleu"] != score(hyps, refs, tgt_lang="en")["bleu"]


def test_score_errors():
    with pytest.raises(NmtError, match="2 hypotheses but 1 references"):
        score(["a", "b"], ["a"])
    with pytest.raises(NmtError, match="nothing to score"):
        score([], [])


def test_score_by_code(real_refs):
    refs, hyps, codes = real_refs
    by = score_by_code(hyps, refs, codes)
    assert sorted(by) == ["cmn_Hans", "cmn_Hant"]
    for code, s in by.items():
        idx = [i for i, c in enumerate(codes) if c == code]
        sub_h, sub_r = [hyps[i] for i in idx], [refs[i] for i in idx]
        assert s["bleu"] == sacrebleu.corpus_bleu(sub_h, [sub_r]).score
        assert s["chrf"] == sacrebleu.corpus_chrf(sub_h, [sub_r]).score
        assert s["sentences"] == len(idx) == 40


# --------------------------------------------------------------------------- evaluate_run


class OracleTranslator:
    """Stands in for a model: returns the reference (Simplified lines) or a degraded one (Traditional)."""

    def __init__(self, outputs: dict[str, str], config):
        self.outputs, self.config = outputs, config
        self.stats, self.beams = DecodeStats(), []
        self.checkpoint, self.device, self.precision = Path("oracle.safetensors"), torch.device("cpu"), "fp32"
        self.engine = SimpleNamespace(name="oracle")

    def translate(self, lines: list[str], beam: int | None = None) -> list[str]:
        self.beams.append(beam)
        self.stats.sentences += len(lines)
        self.stats.src_tokens += 10 * len(lines)
        self.stats.tgt_tokens += 8 * len(lines)
        self.stats.seconds += 0.5
        return [self.outputs[line] for line in lines]


@pytest.fixture(scope="module")
def tiny_run_dir(tmp_path_factory) -> Path:
    return make_tiny_run(tmp_path_factory.mktemp("evaluate"))


def _oracle(run: Path) -> OracleTranslator:
    config = load_config(run / "config.yaml")
    src, ref = read_lines(run / "corpus" / "test.zh"), read_lines(run / "corpus" / "test.en")
    codes = read_lines(run / "corpus" / "test.codes")
    outputs = {
        s: r if c == "cmn_Hans" else _degrade(r, i) for i, (s, r, c) in enumerate(zip(src, ref, codes, strict=True))
    }
    return OracleTranslator(outputs, config)


def test_evaluate_run_report(tiny_run_dir, capsys):
    run = tiny_run_dir
    config = load_config(run / "config.yaml")
    oracle = _oracle(run)
    report = evaluate_run(config, run, EvalJob(split="test", name="oracle", greedy=True), translator=oracle)
    assert oracle.beams == [config.decode.beam, 1]
    refs = read_lines(run / "corpus" / "test.en")
    hyps = read_lines(run / "eval" / "oracle.hyp")
    assert len(hyps) == len(refs) == 24
    saved = json.loads((run / "eval" / "oracle.json").read_text(encoding="utf-8"))
    assert saved == json.loads(json.dumps(report))
    assert saved["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert saved["chrf"] == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert saved["by_code"]["cmn_Hans"]["bleu"] == pytest.approx(100.0)
    assert saved["by_code"]["cmn_Hant"]["bleu"] < 90
    assert saved["by_code"]["cmn_Hant"]["sentences"] == 12
    for key in ("bleu_signature", "chrf_signature", "checkpoint", "sentences", "decode", "speed", "greedy", "codes"):
        assert key in saved, key
    assert saved["decode"]["beam"] == config.decode.beam and saved["decode"]["max_len_a"] == config.decode.max_len_a
    assert saved["speed"]["sentences_per_s"] == pytest.approx(24 / 0.5)
    assert saved["speed"]["tgt_tokens_per_s"] == pytest.approx(8 * 24 / 0.5)
    assert (run / "eval" / "oracle.greedy.hyp").is_file()
    md = (run / "eval" / "oracle.md").read_text(encoding="utf-8")
    assert "| beam 2 | cmn_Hans | 100.00 |" in md and saved["bleu_signature"] in md
    out = capsys.readouterr().out
    assert "cmn_Hant" in out and "nrefs:1" in out
    assert not list((run / "eval").glob(".*.tmp"))


def test_evaluate_run_with_the_model(tiny_run_dir):
    run = tiny_run_dir
    config = load_config(run / "config.yaml")
    report = evaluate_run(
        config, run, EvalJob(split="test"), InferenceOptions(run_dir=run, device="cpu", beam=1), quiet=True
    )
    assert report["name"] == "test.beam1"
    assert report["checkpoint"] == str(run / "checkpoints" / "final.safetensors")
    hyps = read_lines(run / "eval" / "test.beam1.hyp")
    refs = read_lines(run / "corpus" / "test.en")
    assert report["chrf"] == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert report["sentences"] == 24 and report["speed"]["sentences_per_s"] > 0


def test_external_src_ref_with_codes(tiny_run_dir, tmp_path):
    run = tiny_run_dir
    config = load_config(run / "config.yaml")
    oracle = _oracle(run)
    src, ref = tmp_path / "ext.zh", tmp_path / "ext.en"
    src.write_text((run / "corpus" / "test.zh").read_text(encoding="utf-8"), encoding="utf-8")
    ref.write_text((run / "corpus" / "test.en").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "ext.codes.txt").write_text((run / "corpus" / "test.codes").read_text(encoding="utf-8"))
    report = evaluate_run(config, run, EvalJob(src=src, ref=ref), translator=oracle, quiet=True)
    # External files get an "ext-" prefix (a file named test.zh cannot overwrite eval/test.json) and
    # their folder's name (two sets named test.zh in two folders do not overwrite each other).
    name = f"ext-{tmp_path.name}.ext"
    assert report["name"] == name and report["src"] == str(src)
    assert set(report["by_code"]) == {"cmn_Hans", "cmn_Hant"}
    assert (run / "eval" / f"{name}.json").is_file()


def test_two_external_sets_named_alike_get_two_reports(tiny_run_dir, tmp_path):
    run = tiny_run_dir
    config = load_config(run / "config.yaml")
    names = []
    for folder, n in (("news", 5), ("tatoeba", 7)):
        (tmp_path / folder).mkdir()
        src, ref = tmp_path / folder / "test.zh", tmp_path / folder / "test.en"
        src.write_text("".join(read_lines(run / "corpus" / "test.zh")[i] + "\n" for i in range(n)), encoding="utf-8")
        ref.write_text("".join(read_lines(run / "corpus" / "test.en")[i] + "\n" for i in range(n)), encoding="utf-8")
        names.append(evaluate_run(config, run, EvalJob(src=src, ref=ref), translator=_oracle(run), quiet=True)["name"])
    assert names == ["ext-news.test", "ext-tatoeba.test"]
    assert [json.loads((run / "eval" / f"{n}.json").read_text())["sentences"] for n in names] == [5, 7]


def test_misaligned_codes_are_ignored(tiny_run_dir, tmp_path, capsys):
    run = tiny_run_dir
    config = load_config(run / "config.yaml")
    src, ref = tmp_path / "ext.zh", tmp_path / "ext.en"
    src.write_text((run / "corpus" / "test.zh").read_text(encoding="utf-8"), encoding="utf-8")
    ref.write_text((run / "corpus" / "test.en").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "ext.codes").write_text("cmn_Hans\n" * 5)
    report = evaluate_run(config, run, EvalJob(src=src, ref=ref), translator=_oracle(run), quiet=True)
    assert "by_code" not in report
    assert "5 codes for 24 sentences" in capsys.readouterr().err


def test_raw_references_are_scored(tiny_run_dir, tmp_path):
    """References are not normalised: a system that outputs them verbatim scores 100."""
    run = tiny_run_dir
    config = load_config(run / "config.yaml")
    src, ref = tmp_path / "raw.zh", tmp_path / "raw.en"
    src.write_text("我们\n猫\n", encoding="utf-8")
    ref.write_text("ＡＢＣ  is　full-width.\nThe cat ﬁnds it.\n", encoding="utf-8")
    oracle = OracleTranslator({"我们": "ＡＢＣ  is　full-width.", "猫": "The cat ﬁnds it."}, config)
    report = evaluate_run(config, run, EvalJob(src=src, ref=ref), translator=oracle, quiet=True)
    assert report["bleu"] == pytest.approx(100)


def test_src_ref_mismatch_names_both_files(tiny_run_dir, tmp_path):
    run = tiny_run_dir
    config = load_config(run / "config.yaml")
    src, ref = tmp_path / "a.zh", tmp_path / "b.en"
    src.write_text("一\n二\n三\n", encoding="utf-8")
    ref.write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(NmtError) as err:
        evaluate_run(config, run, EvalJob(src=src, ref=ref), translator=_oracle(run), quiet=True)
    assert str(src) in str(err.value) and str(ref) in str(err.value) and "3 lines" in str(err.value)
    with pytest.raises(NmtError, match="go together"):
        evaluate_run(config, run, EvalJob(src=src), translator=_oracle(run), quiet=True)
    with pytest.raises(NmtError, match="valid.zh: not found"):
        evaluate_run(config, run, EvalJob(split="valid"), translator=_oracle(run), quiet=True)


def test_passthrough_score_in_report_table_and_markdown(tmp_path, capsys):
    """Of the source spans also in the reference, the share the output keeps (no real data needed)."""
    from nmt.config import config_from_dict

    config = config_from_dict({"data": {"passthrough": []}})  # off: scored on every kind all the same
    src, ref = tmp_path / "s.zh", tmp_path / "r.en"
    src.write_text("我爱 AI。\n我在２０２４年见过Tom。\n他有三个苹果。\n", encoding="utf-8")
    ref.write_text("I love AI.\nI met Tom in 2024.\nHe has 3 apples.\n", encoding="utf-8")
    outputs = {
        "我爱 AI。": "I love the president.",
        "我在２０２４年见过Tom。": "I saw Tom in 2024.",
        "他有三个苹果。": "x",
    }
    report = evaluate_run(config, tmp_path, EvalJob(src=src, ref=ref), translator=OracleTranslator(outputs, config))
    assert report["passthrough"] == {"spans": 3, "kept": 2, "accuracy": pytest.approx(2 / 3)}
    assert "pass-through 66.7% (2 of 3 spans kept)" in capsys.readouterr().out
    assert "pass-through 66.7%" in (tmp_path / "eval" / f"{report['name']}.md").read_text(encoding="utf-8")


def test_read_lines_ignores_a_bom(tmp_path):
    """`nmt eval --src/--ref` files saved with a UTF-8 BOM: the first line is the sentence, not U+FEFF + it."""
    path = tmp_path / "ref.en"
    path.write_bytes("\ufeff".encode() + b"I like cats.\nIt rains.\n")
    assert read_lines(path) == ["I like cats.", "It rains."]


def test_the_model_line_names_the_checkpoint_its_update_and_the_decoding(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    from nmt.decode.evaluate import model_line

    path = tmp_path / "final.safetensors"
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(path), metadata={"step": "1080"})
    decode = {"beam": 5, "engine": "native", "precision": "bf16", "device": "cpu"}
    assert model_line({"checkpoint": str(path), "decode": decode}) == (
        "final.safetensors at update 1,080; beam 5, native bf16 on cpu"
    )
    export = {"checkpoint": str(tmp_path), "decode": decode | {"engine": "ctranslate2"}}  # an export folder
    assert model_line(export) == f"{tmp_path.name}; beam 5, ctranslate2 bf16 on cpu"


@pytest.mark.slow
def test_the_raw_path_gives_the_model_unmasked_text_and_reports_beside_the_masked_one(trained_run, tmp_path):
    """`nmt eval --no-passthrough`: what an exported model meets in Argos or transformers."""
    from nmt.decode.translator import Translator

    config = load_config(trained_run / "config.yaml")
    masked = Translator.from_options(InferenceOptions(run_dir=trained_run), config)
    raw = Translator.from_options(InferenceOptions(run_dir=trained_run, passthrough=False), config)
    assert masked.masker is not None and raw.masker is None
    src, ref = tmp_path / "names.zh", tmp_path / "names.en"
    src.write_text("我爱 AI。\n我在2024年见过Tom。\n", encoding="utf-8")
    ref.write_text("I love AI.\nI met Tom in 2024.\n", encoding="utf-8")
    opts = InferenceOptions(run_dir=trained_run, passthrough=False, beam=1)
    report = evaluate_run(config, trained_run, EvalJob(src=src, ref=ref, name="names"), opts, quiet=True)
    assert report["passthrough"]["spans"] == 3  # scored on the same spans as the masked path
    opts = InferenceOptions(run_dir=trained_run, passthrough=False, beam=1)
    report = evaluate_run(config, trained_run, EvalJob(split="valid"), opts, quiet=True)
    assert report["name"] == "valid.beam1.raw" and (trained_run / "eval/valid.beam1.raw.json").is_file()
