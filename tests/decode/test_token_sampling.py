"""Sampling (`nmt.decode.token_sampling`): validated settings, seeded and batch-invariant draws, top-k
and top-p restrictions, top-k 1 = greedy, and the CLI options."""

from __future__ import annotations

import pytest
import torch

from nmt import EOS_ID, PAD_ID
from nmt.config import ModelConfig
from nmt.decode.options import Sampling
from nmt.decode.search import greedy_search
from nmt.decode.token_sampling import sample_tokens, sentence_keys, uniforms
from nmt.errors import NmtError
from nmt.model.transformer import Transformer

VOCAB = 40


@pytest.fixture(scope="module")
def model() -> Transformer:
    """A random (untrained) model: its next-token distributions are broad, so samples vary."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=64, dropout=0.0)
    return Transformer(cfg, VOCAB, VOCAB).eval()


def sources(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (n, 7), generator=gen)
    src[:, -1] = EOS_ID
    src[1, 3:] = PAD_ID  # a shorter sentence
    src[1, 3] = EOS_ID
    return src


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"topk": -1}, "--sample-topk -1: must be >= 0"),
        ({"topp": 0.0}, r"--sample-topp 0.0: must be in \(0, 1\]"),
        ({"topp": 1.5}, r"--sample-topp 1.5: must be in \(0, 1\]"),
        ({"temperature": 0.0}, "--temperature 0.0: must be a finite number > 0"),
        ({"temperature": float("inf")}, "--temperature inf"),
        ({"seed": -3}, "--seed -3: must be >= 0"),
    ],
)
def test_bad_settings_are_one_line_errors(settings, message):
    with pytest.raises(NmtError, match=message) as err:
        Sampling(**settings)
    assert "\n" not in str(err.value)


def test_uniforms_are_deterministic_spread_and_depend_on_seed_sentence_and_step():
    keys = torch.arange(5000, dtype=torch.long) * 7919
    u = uniforms(1, keys, 3)
    assert torch.equal(u, uniforms(1, keys, 3))
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.02 and abs(float((u < 0.25).double().mean()) - 0.25) < 0.02
    for other in (uniforms(2, keys, 3), uniforms(1, keys, 4), uniforms(1, keys + 1, 3)):
        assert float((other != u).double().mean()) > 0.99


def test_top_k_one_is_the_argmax_and_top_k_and_top_p_restrict_the_draws():
    torch.manual_seed(0)
    logits = torch.randn(6, VOCAB)
    keys = torch.arange(6, dtype=torch.long)
    assert torch.equal(sample_tokens(logits.clone(), Sampling(topk=1, seed=5), keys, 0), logits.argmax(-1))
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(4000, 4).clone()
    many = torch.arange(4000, dtype=torch.long)
    drawn = sample_tokens(probs, Sampling(seed=1), many, 0)
    freq = torch.bincount(drawn, minlength=4).double() / 4000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64), atol=0.03)
    assert set(sample_tokens(probs, Sampling(topk=2, seed=1), many, 0).tolist()) == {0, 1}
    assert set(sample_tokens(probs, Sampling(topp=0.6, seed=1), many, 0).tolist()) == {0, 1}  # 0.5 < 0.6 <= 0.8
    assert set(sample_tokens(probs, Sampling(topp=0.5, seed=1), many, 0).tolist()) == {0}
    sharp = sample_tokens(probs, Sampling(temperature=0.1, seed=1), many, 0)
    assert float((sharp == 0).double().mean()) > 0.99  # a low temperature is nearly greedy
    forbidden = probs.clone()
    forbidden[:, 0] = float("-inf")
    assert 0 not in sample_tokens(forbidden, Sampling(seed=1), many, 0).tolist()


def test_sampling_with_top_k_one_equals_greedy_search(model):
    src = sources(6)
    assert greedy_search(model, src, sampling=Sampling(topk=1, seed=9)) == greedy_search(model, src)


def test_same_seed_same_output_other_seeds_differ_and_batches_do_not_matter(model):
    src = sources(8)
    first = greedy_search(model, src, sampling=Sampling(seed=1))
    assert greedy_search(model, src, sampling=Sampling(seed=1)) == first
    assert greedy_search(model, src, sampling=Sampling(seed=2)) != first
    alone = [greedy_search(model, src[i : i + 1], sampling=Sampling(seed=1))[0] for i in range(len(src))]
    assert alone == first  # a sentence's sample does not depend on the rest of its batch
    assert greedy_search(model, src, sampling=Sampling(seed=1)) != greedy_search(model, src)  # it does sample


def test_sentence_keys_ignore_padding():
    a = torch.tensor([[5, 6, EOS_ID, PAD_ID, PAD_ID]])
    b = torch.tensor([[5, 6, EOS_ID]])
    assert torch.equal(sentence_keys(a), sentence_keys(b))
    assert not torch.equal(sentence_keys(a), sentence_keys(torch.tensor([[6, 5, EOS_ID]])))


@pytest.mark.slow
def test_cli_sampling_is_reproducible_and_checked(tiny_run):
    from typer.testing import CliRunner

    from nmt.cli import app

    lines = ["我们九点见。", "他们买了七只红色的猫。"]
    args = ["translate", "--run", str(tiny_run), "--engine", "native", "--sample-topk", "5", "--seed", "3", *lines]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert CliRunner().invoke(app, args).stdout == first.stdout and len(first.stdout.splitlines()) == 2
    greedy = CliRunner().invoke(app, ["translate", "--run", str(tiny_run), "--engine", "native", "--beam", "1", *lines])
    top1 = CliRunner().invoke(
        app, ["translate", "--run", str(tiny_run), "--engine", "native", "--sample-topk", "1", *lines]
    )
    assert top1.stdout == greedy.stdout
    bad = CliRunner().invoke(
        app, ["translate", "--run", str(tiny_run), "--engine", "native", "--temperature", "0", "x"]
    )
    assert bad.exit_code == 1 and bad.stderr.startswith("error: --temperature 0.0") and bad.stderr.count("\n") == 1
