"""FastDecoder against the reference step (`Transformer.decode_step`): the same logits bit for bit,
so the same tokens and scores from greedy and beam search."""

from __future__ import annotations

import copy

import pytest
import torch

from nmt.config import ModelConfig
from nmt.data.vocab import PAD_ID
from nmt.decode.search import beam_search, greedy_search
from nmt.errors import NmtError
from nmt.model.fast_decoder import FastDecoder, fast_decoder
from nmt.model.transformer import Transformer

VOCAB = 40


def _model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    settings = {"d_model": 32, "heads": 4, "encoder_layers": 2, "decoder_layers": 2, "ffn_dim": 64, "dropout": 0.0}
    cfg = ModelConfig(**(settings | {"max_positions": 40} | overrides))
    return Transformer(cfg, VOCAB, VOCAB).eval()


def _sources(n: int, seed: int = 0) -> torch.Tensor:
    """(n, S) ids + EOS, right-padded: lengths 1..7, so a batch has padding (and a cross bias)."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randint(4, VOCAB, (int(torch.randint(1, 8, (1,), generator=gen)),), generator=gen) for _ in range(n)]
    width = max(len(r) for r in rows) + 1
    src = torch.full((n, width), PAD_ID)
    for i, r in enumerate(rows):
        src[i, : len(r)] = r
        src[i, len(r)] = 2  # EOS
    return src


def _converted(model: Transformer, precision: str, kernel: str = "") -> Transformer:
    from nmt.model.convert import inference_model

    return inference_model(copy.deepcopy(model), torch.device("cpu"), precision, kernel)


def _steps_agree(model: Transformer, src: torch.Tensor, steps: int = 6, beam: int = 1) -> None:
    """Drive the reference and the fast step side by side from one encoder output: after the
    first step every sentence's rows are expanded to `beam` and then shuffled among the beams of
    their sentence (a beam search's reorders); logits must be identical at every step."""
    fast = FastDecoder(model)
    with torch.inference_mode():
        enc = model.encode(src)
        ref_state, fast_state = model.start_decoding(enc), fast.start_decoding(enc)
        tokens = torch.full((src.size(0),), 1)  # BOS
        gen = torch.Generator().manual_seed(1)
        for t in range(steps):
            want, got = model.decode_step(tokens, ref_state), fast.decode_step(tokens, fast_state)
            assert got.dtype == torch.float32 and torch.equal(got, want), f"step {t}"
            tokens = want.argmax(-1)
            if t == 0 and beam > 1:
                rows = torch.arange(src.size(0)).repeat_interleave(beam)
                for state in (ref_state, fast_state):
                    state.reorder(rows, beam=beam)
                tokens = tokens[rows]
            elif beam > 1:
                rows = (
                    torch.randint(0, beam, (tokens.numel(),), generator=gen)
                    + torch.arange(tokens.numel()) // beam * beam
                )
                for state in (ref_state, fast_state):
                    state.reorder(rows)
                tokens = tokens[rows]


@pytest.mark.invariance
@pytest.mark.parametrize("batch", [1, 3, 16])
@pytest.mark.parametrize("beam", [1, 4])
def test_fast_step_equals_the_reference_step_bit_for_bit(batch, beam):
    model = _model()
    _steps_agree(model, _sources(batch), beam=beam)
    _steps_agree(_converted(model, "fp32"), _sources(batch, seed=2), beam=beam)  # packed / one-row layers


@pytest.mark.precision
@pytest.mark.int8
@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_fast_step_equals_the_reference_step_in_other_precisions(precision):
    from nmt.decode.precision import cpu_precisions
    from nmt.model.convert import int8_kernels

    if precision not in cpu_precisions():
        pytest.skip(f"{precision} does not run here")
    kernels = int8_kernels() if precision == "int8" else [""]
    for kernel in kernels:
        converted = _converted(_model(), precision, kernel)
        for batch in (1, 5):
            _steps_agree(converted, _sources(batch), beam=1)
            _steps_agree(converted, _sources(batch, seed=3), beam=3)


def test_learned_positions_and_an_untied_output_projection():
    model = _model(positions="learned", tie_embeddings=False)
    _steps_agree(model, _sources(4), beam=2)


@pytest.mark.invariance
def test_searches_find_the_same_tokens_and_scores():
    model = _converted(_model(seed=4), "fp32")
    fast = FastDecoder(model)
    for batch in (1, 3, 16):
        src = _sources(batch, seed=batch)
        assert greedy_search(fast, src) == greedy_search(model, src)
        assert greedy_search(fast, src, no_repeat_ngram=2) == greedy_search(model, src, no_repeat_ngram=2)
        got, want = (beam_search(m, src, beam=4, nbest=2, no_repeat_ngram=3) for m in (fast, model))
        assert [[(h.tokens, h.score) for h in row] for row in got] == [
            [(h.tokens, h.score) for h in row] for row in want
        ]


@pytest.mark.invariance
def test_an_ensemble_steps_through_its_members_fast_decoders_with_the_same_result():
    from nmt.model.ensemble import Ensemble

    members = [_converted(_model(seed=s), "fp32") for s in (1, 2)]
    plain, fast = Ensemble(members), fast_decoder(Ensemble(members))
    assert all(isinstance(m, FastDecoder) for m in fast.steppers) and not any(
        isinstance(m, FastDecoder) for m in plain.steppers
    )
    src = _sources(3, seed=7)
    got, want = (beam_search(m, src, beam=3, nbest=2) for m in (fast, plain))
    assert [[(h.tokens, h.score) for h in row] for row in got] == [[(h.tokens, h.score) for h in row] for row in want]
    assert greedy_search(fast, src) == greedy_search(plain, src)


def test_only_pre_norm_transformers_in_eval_mode_get_one():
    assert isinstance(fast_decoder(_model()), FastDecoder)
    post = _model(norm="post")
    assert fast_decoder(post) is post
    training = _model().train()
    assert fast_decoder(training) is training
    other = object()
    assert fast_decoder(other) is other


def test_a_step_past_max_positions_is_one_error_line():
    model = _model(max_positions=3)
    fast = FastDecoder(model)
    with torch.inference_mode():
        state = fast.start_decoding(fast.encode(torch.tensor([[5, 2]])))
        tokens = torch.tensor([1])
        for _ in range(3):
            tokens = fast.decode_step(tokens, state).argmax(-1)
        with pytest.raises(NmtError, match="exceeds model.max_positions=3"):
            fast.decode_step(tokens, state)
