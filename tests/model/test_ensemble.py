"""Ensembles (`nmt.model.ensemble`): a model with itself is the model, the step is the mean of the
members' log-probabilities, results do not depend on the batch, vocabularies must match."""

from __future__ import annotations

import shutil

import pytest
import torch

from nmt import EOS_ID, PAD_ID
from nmt.config import ModelConfig
from nmt.decode.search import beam_search, greedy_search
from nmt.errors import NmtError
from nmt.model.ensemble import Ensemble, check_vocabularies
from nmt.model.transformer import Transformer

VOCAB = 30


def model(seed: int, d_model: int = 32) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=d_model, heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=64, dropout=0.0)
    return Transformer(cfg, VOCAB, VOCAB).eval()


def sources() -> torch.Tensor:
    src = torch.randint(4, VOCAB, (5, 6), generator=torch.Generator().manual_seed(3))
    src[:, -1] = EOS_ID
    src[2, 2:] = PAD_ID
    src[2, 2] = EOS_ID
    return src


def pairs(hyps):
    return [[(h.tokens, h.score) for h in row] for row in hyps]


def test_an_ensemble_of_a_model_with_itself_is_the_model():
    m, src = model(0), sources()
    twice = Ensemble([m, m])
    assert pairs(beam_search(twice, src, beam=3, nbest=3)) == pairs(beam_search(m, src, beam=3, nbest=3))
    assert greedy_search(twice, src) == greedy_search(m, src)


def test_the_step_is_the_mean_of_the_members_log_probabilities():
    a, b = model(0), model(1, d_model=16)  # shapes may differ
    src = sources()
    both = Ensemble([a, b])
    tokens = torch.full((src.size(0),), 2)  # BOS
    with torch.no_grad():
        got = both.decode_step(tokens, both.start_decoding(both.encode(src)))
        lp = [torch.log_softmax(m.decode_step(tokens, m.start_decoding(m.encode(src))), dim=-1) for m in (a, b)]
    torch.testing.assert_close(got, (lp[0] + lp[1]) / 2)
    assert both.max_positions == min(a.max_positions, b.max_positions) and both.cfg is a.cfg


def test_a_two_model_ensemble_is_batch_invariant():
    both, src = Ensemble([model(0), model(1)]), sources()
    together = pairs(beam_search(both, src, beam=3, nbest=2))
    alone = [pairs(beam_search(both, src[i : i + 1, : int((src[i] != PAD_ID).sum())], beam=3, nbest=2))[0]
             for i in range(src.size(0))]  # fmt: skip
    for row, single in zip(together, alone, strict=True):
        assert [t for t, _ in row] == [t for t, _ in single]
        assert [s for _, s in row] == pytest.approx([s for _, s in single], abs=1e-5)


def test_vocabularies_must_be_the_same_files(tmp_path):
    for run, target in (("a", b"en-1"), ("b", b"en-1"), ("c", b"en-2")):
        (tmp_path / run).mkdir()
        (tmp_path / run / "zh.model").write_bytes(b"zh")
        (tmp_path / run / "en.model").write_bytes(target)
    vocab = {r: (tmp_path / r / "zh.model", tmp_path / r / "en.model") for r in "abc"}
    check_vocabularies([vocab["a"], vocab["b"]])
    with pytest.raises(NmtError, match=r"c/en.model is not the target vocabulary of the first model") as err:
        check_vocabularies([vocab["a"], vocab["b"], vocab["c"]])
    assert "\n" not in str(err.value)


def test_ensembles_need_the_native_engine(tmp_path):
    from nmt.decode.translator import Translator

    with pytest.raises(NmtError, match="ensembles decode with the native engine, not ctranslate2"):
        Translator.from_run(tmp_path, ensemble=(tmp_path / "x.safetensors",), engine="ctranslate2")


@pytest.mark.slow
def test_cli_ensemble_equals_the_model_alone_and_refuses_another_vocabulary(tiny_run, tmp_path):
    from typer.testing import CliRunner

    from nmt.cli import app

    final = str(tiny_run / "checkpoints" / "final.safetensors")
    lines = ["我们九点见。", "他们买了七只红色的猫。"]
    base = ["translate", "--run", str(tiny_run), "--precision", "fp32"]
    alone = CliRunner().invoke(app, [*base, "--checkpoint", final, *lines])
    twice = CliRunner().invoke(app, [*base, "--checkpoint", final, "--checkpoint", final, *lines])
    assert alone.exit_code == 0 and twice.exit_code == 0, twice.output
    assert twice.stdout == alone.stdout
    other = tmp_path / "other"
    shutil.copytree(tiny_run / "vocab", other / "vocab")
    shutil.copy(other / "vocab" / "zh.model", other / "vocab" / "en.model")  # a different target vocabulary
    (other / "checkpoints").mkdir()
    shutil.copy(final, other / "checkpoints" / "final.safetensors")
    bad = CliRunner().invoke(
        app, [*base, "--checkpoint", final, "--checkpoint", str(other / "checkpoints" / "final.safetensors"), "x"]
    )  # noqa: E501
    assert bad.exit_code == 1 and "is not the target vocabulary of the first model" in bad.stderr
    assert bad.stderr.count("\n") == 1


@pytest.mark.slow
def test_serve_decodes_an_ensemble(tiny_run):
    from serving import request, start_server, stop

    final = str(tiny_run / "checkpoints" / "final.safetensors")
    lines = ["我们九点见。", "他们买了七只红色的猫。"]
    proc, port = start_server(tiny_run, "--checkpoint", final, "--checkpoint", final, "--workers", "1")
    try:
        status, body = request(port, "POST", "/translate", {"text": lines, "beam": 2})
    finally:
        stop(proc)
    assert status == 200, body
    from nmt.decode.translator import Translator

    alone = Translator.from_run(tiny_run, final, device="cpu", precision="fp32").translate(lines, beam=2)
    assert [t["text"] for t in body["translations"]] == alone
    assert "ensemble member 2" in proc.startup
