"""`nmt backtranslate` with a real (tiny, en→zh) reverse model: pairs = kept lines in order with
the real side verbatim, the overlap guard, resuming after a kill equals an uninterrupted run."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, TINY_LEARNS
from learning import assert_learned
from synthetic import pairs

from nmt.config import load_config
from nmt.decode.backtranslate import PARTIAL, PROGRESS, BacktranslateOptions, backtranslate
from nmt.decode.options import InferenceOptions
from nmt.errors import NmtError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reverse_run(tiny_en_zh_run):
    """An en→zh tiny run trained on the generated mirror (conftest; shared with test_pipeline)."""
    return tiny_en_zh_run


@pytest.fixture(scope="module")
def mono(reverse_run, tmp_path_factory):
    """English text no training pair uses, plus a test reference of the run and a duplicate."""
    folder = tmp_path_factory.mktemp("mono")
    corpus = reverse_run / "corpus"
    held = {line for split in ("valid", "test") for line in (corpus / f"{split}.en").read_text().splitlines()}
    english = [en for _, en in pairs(200, seed=99) if en not in held][:60]  # the generated task is small
    reference = (corpus / "test.en").read_text(encoding="utf-8").splitlines()[0]
    lines = [*english[:30], reference, english[0], *english[30:]]
    (folder / "train.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder, english, reference


def options(run, folder, output, **kw) -> BacktranslateOptions:
    inference = InferenceOptions(run_dir=run, device="cpu", precision="fp32", beam=kw.pop("beam", 2))
    return BacktranslateOptions(inference=inference, mono=folder, output=output, chunk=kw.pop("chunk", 16), **kw)


def read_pairs(path):
    return [json.loads(line)["translation"] for line in path.read_text(encoding="utf-8").splitlines()]


def test_pairs_are_the_kept_lines_in_order_with_the_real_side_verbatim(reverse_run, mono, tmp_path):
    folder, english, reference = mono
    stats = backtranslate(options(reverse_run, folder, tmp_path / "bt"))
    got = read_pairs(tmp_path / "bt" / "train.jsonl")
    assert [p["en"] for p in got] == english  # order kept; the reference and the duplicate dropped
    assert stats["dropped"]["overlap"] == 1 and stats["dropped"]["duplicate"] == 1 and stats["pairs"] == 60
    assert all(p["zh"] and not set(p["zh"]) & set("abcdefghijklmnopqrstuvwxyz") for p in got)  # Chinese out
    assert not (tmp_path / "bt" / PARTIAL).exists() and not (tmp_path / "bt" / PROGRESS).exists()
    again = backtranslate(options(reverse_run, folder, tmp_path / "bt"))  # finished: nothing to redo
    assert again["fingerprint"] == stats["fingerprint"]


def test_a_reverse_model_below_the_floor_is_refused_before_anything_is_written(reverse_run, mono, tmp_path):
    from nmt.decode.valid_score import validation_bleu
    from nmt.run.checkpoints import find_inference_checkpoint

    folder, _, _ = mono
    score, where = validation_bleu(find_inference_checkpoint(reverse_run))
    with pytest.raises(NmtError, match=rf"validation BLEU {score:.2f} \(read from .*\) is below the floor") as e:
        backtranslate(options(reverse_run, folder, tmp_path / "bt", min_valid_bleu=score + 1))
    assert where in str(e.value) and not (tmp_path / "bt").exists()


def test_no_repeat_ngram_is_3_by_default_and_part_of_the_fingerprint(reverse_run, mono, tmp_path):
    folder, _, _ = mono
    default = backtranslate(options(reverse_run, folder, tmp_path / "a"))
    own = backtranslate(options(reverse_run, folder, tmp_path / "b", no_repeat_ngram=None))  # the run's: 0
    assert default["decode"]["no_repeat_ngram"] == 3 and own["decode"]["no_repeat_ngram"] == 0
    assert default["fingerprint"] != own["fingerprint"]


def test_a_hub_dataset_of_text_rows_is_backtranslated_like_a_file(reverse_run, mono, tmp_path, monkeypatch):
    """`--mono hub:NAME?column=text` through `datasets.load_dataset` (faked, with the rows
    schema of a text dataset such as Salesforce/wikitext): the same pairs as the same lines in a file."""
    import datasets

    folder, _, _ = mono
    lines = (folder / "train.en").read_text(encoding="utf-8").splitlines()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: iter([{"text": f" {x} \n"} for x in lines]))
    from_hub = backtranslate(options(reverse_run, "hub:some/text?column=text", tmp_path / "hub"))
    from_file = backtranslate(options(reverse_run, folder, tmp_path / "file"))
    assert read_pairs(tmp_path / "hub" / "train.jsonl") == read_pairs(tmp_path / "file" / "train.jsonl")
    assert from_hub["dropped"] == from_file["dropped"] and from_hub["source"] == "hub:some/text?split=train&column=text"


def test_a_killed_run_resumes_without_duplicating_or_losing_lines(reverse_run, mono, tmp_path):
    folder, _, _ = mono
    whole = tmp_path / "whole"
    backtranslate(options(reverse_run, folder, whole))

    class Killed(Exception):
        pass

    def kill_after_two_chunks(done, total):
        if done >= 32:
            with open(tmp_path / "part" / PARTIAL, "ab") as f:
                f.write(b'{"translation": {"en": "half a chunk written when the process died')  # no record
            raise Killed

    with pytest.raises(Killed):
        backtranslate(options(reverse_run, folder, tmp_path / "part"), on_chunk=kill_after_two_chunks)
    assert json.loads((tmp_path / "part" / PROGRESS).read_text())["lines"] == 32
    backtranslate(options(reverse_run, folder, tmp_path / "part"))
    assert (tmp_path / "part" / "train.jsonl").read_bytes() == (whole / "train.jsonl").read_bytes()


def test_another_command_on_an_unfinished_output_is_refused(reverse_run, mono, tmp_path):
    folder, _, _ = mono

    def stop(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        backtranslate(options(reverse_run, folder, tmp_path / "bt"), on_chunk=stop)
    with pytest.raises(NmtError, match="holds an unfinished back-translation of other text, model or settings"):
        backtranslate(options(reverse_run, folder, tmp_path / "bt", beam=1))


def test_cli_backtranslate_with_sampling(reverse_run, mono, tmp_path):
    from typer.testing import CliRunner

    from nmt.cli import app

    folder, english, _ = mono
    out = tmp_path / "cli"
    args = ["backtranslate", "--run", str(reverse_run), "--mono", str(folder / "train.en"), "--output", str(out)]
    result = CliRunner().invoke(app, [*args, "--sample-topk", "5", "--seed", "2", "--precision", "fp32"])
    assert result.exit_code == 0, result.output
    assert "60 synthetic pairs" in result.stderr
    assert [p["en"] for p in read_pairs(out / "train.jsonl")] == english
    missing = CliRunner().invoke(
        app, ["backtranslate", "--run", str(reverse_run), "--mono", str(tmp_path / "no"), "-o", str(out)]
    )
    assert missing.exit_code == 1 and "monolingual text not found" in missing.stderr
    low = CliRunner().invoke(app, [*args[:-1], str(tmp_path / "low"), "--min-valid-bleu", "1000"])
    assert low.exit_code == 1 and "is below the floor 1000" in low.stderr and "Traceback" not in low.output
    assert not (tmp_path / "low").exists()


@pytest.mark.learning
def test_a_forward_run_trains_on_real_and_tagged_synthetic_pairs(reverse_run, mono, mini_mirror, tmp_path):
    """data.backtranslation: synthetic pairs appended to train (tagged, cleaned, real pairs
    upsampled), valid/test untouched, the tag one piece of the source vocabulary only, and never
    in a translation."""
    import sentencepiece as spm

    from nmt.config import BT_TAG
    from nmt.decode.translator import Translator
    from nmt.pipeline import run_pipeline
    from nmt.run.dirs import init_run

    folder, english, _ = mono
    backtranslate(options(reverse_run, folder, tmp_path / "bt"))
    bt = [f"data.backtranslation={{corpus: {tmp_path / 'bt'}, tag: true, real_upsample: 2}}"]
    config = load_config(ROOT / "configs" / "tiny.yaml", [*TINY_LEARNS, *bt])
    run = tmp_path / "forward"
    init_run(config, run)
    result = run_pipeline(config, run, mirror=str(mini_mirror))
    stats = json.loads((run / "corpus" / "stats.json").read_text())
    train_zh = (run / "corpus" / "train.zh").read_text(encoding="utf-8").splitlines()
    tagged = [line for line in train_zh if line.startswith(BT_TAG + " ")]
    assert len(tagged) == stats["backtranslation"]["kept"] > 0
    assert len(train_zh) == 2 * stats["train"]["kept"] + len(tagged)
    sample_zh = (run / "vocab" / "sample.zh").read_text(encoding="utf-8").splitlines()  # all of train fits
    sample_en = set((run / "vocab" / "sample.en").read_text(encoding="utf-8").splitlines())
    assert sorted(sample_zh) == sorted(train_zh[: -len(tagged)])  # the source vocabulary: real text only
    assert sample_en & set(english)  # the target side of synthetic pairs is real text: it stays
    for split in ("valid", "test"):  # untouched: as many lines as a run without synthetic pairs
        lines = (run / "corpus" / f"{split}.zh").read_text(encoding="utf-8")
        assert BT_TAG not in lines and len(lines.splitlines()) == stats[split]["kept"]
    src = spm.SentencePieceProcessor(model_file=str(run / "vocab" / "zh.model"))
    tgt = spm.SentencePieceProcessor(model_file=str(run / "vocab" / "en.model"))
    assert src.piece_to_id(BT_TAG) != src.unk_id() and BT_TAG in src.encode(f"{BT_TAG} 你好", out_type=str)
    assert BT_TAG not in {tgt.id_to_piece(i) for i in range(tgt.get_piece_size())}
    lines = (run / "corpus" / "test.zh").read_text(encoding="utf-8").splitlines()[:20]
    out = Translator.from_run(run, device="cpu", precision="fp32").translate(lines, beam=2)
    assert not any("BT" in o or "⦅" in o for o in out)
    assert_learned("backtranslation/test_bleu", result["eval"]["bleu"], 20)  # real + synthetic still learns the task
