"""Greedy and beam search: hand-built toy models whose best outputs are known, and a tiny Transformer."""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from learning import TEST_SEED, assert_learned
from tiers import trains

from nmt import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt.decode.options import Sampling
from nmt.decode.search import Hypothesis, beam_search, greedy_search

A, B, C = 4, 5, 6  # the toy vocabulary's real tokens


pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- toy models


class ToyState:
    """Keeps each row's source and generated prefix; reorder works like the real KV cache."""

    def __init__(self, src: torch.Tensor):
        self.src = src  # (R, S)
        self.prefix = torch.zeros(src.size(0), 0, dtype=torch.long)  # (R, t), BOS not included

    def reorder(self, index: torch.Tensor, sentences: torch.Tensor | None = None, beam: int | None = None) -> None:
        self.src = self.src.index_select(0, index)  # every row keeps its own source, whatever the beam
        self.prefix = self.prefix.index_select(0, index)


class ToyModel:
    """Decoding protocol over a Python function `fn(source ids, prefix) -> logits (V,)`."""

    def __init__(
        self, vocab: int, fn: Callable[[tuple, tuple], list[float]], max_positions: int = 1024, specials: bool = False
    ):
        self.vocab, self.fn, self.max_positions = vocab, fn, max_positions
        self.specials = specials  # True: PAD/UNK/BOS keep the logits fn gives them
        self.steps = 0

    def encode(self, src: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(memory=src, src_pad=src == PAD_ID)

    def start_decoding(self, enc: SimpleNamespace) -> ToyState:
        return ToyState(enc.memory)

    def decode_step(self, tokens: torch.Tensor, state: ToyState) -> torch.Tensor:
        self.steps += 1
        if state.prefix.size(1) > 0 or bool((tokens != BOS_ID).any()):
            state.prefix = torch.cat([state.prefix, tokens.unsqueeze(1)], dim=1)
        rows = []
        for src, prefix in zip(state.src.tolist(), state.prefix.tolist(), strict=True):
            logits = torch.tensor(self.fn(tuple(t for t in src if t != PAD_ID), tuple(prefix)), dtype=torch.float)
            if not self.specials:
                logits[[PAD_ID, UNK_ID, BOS_ID]] = float("-inf")
            rows.append(logits)
        return torch.stack(rows)

    def logprob(self, src: list[int], tokens: list[int]) -> float:
        """Sum of log-probs of `tokens + [EOS]` (PAD/UNK/BOS are impossible, as in the search)."""
        total = 0.0
        for i, tok in enumerate([*tokens, EOS_ID]):
            logits = torch.tensor(self.fn((*src, EOS_ID), tuple(tokens[:i])), dtype=torch.float)
            logits[[PAD_ID, UNK_ID, BOS_ID]] = float("-inf")
            total += float(torch.log_softmax(logits, -1)[tok])
        return total


def random_fn(vocab: int, eos_rise: float = 0.4) -> Callable[[tuple, tuple], list[float]]:
    """Deterministic pseudo-random logits per (source, prefix); EOS gets likelier as the prefix grows."""

    def fn(src: tuple, prefix: tuple) -> list[float]:
        seed = zlib.crc32(repr((src, prefix)).encode())
        logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 2.0
        logits[EOS_ID] += eos_rise * len(prefix) - 1.0
        return logits.tolist()

    return fn


def table_fn(table: dict[tuple, dict[int, float]], vocab: int) -> Callable[[tuple, tuple], list[float]]:
    """Probabilities given per prefix; unknown prefixes end at once."""

    def fn(src: tuple, prefix: tuple) -> list[float]:
        probs = table.get(prefix, {EOS_ID: 1.0})
        return [math.log(probs[i]) if probs.get(i, 0) > 0 else float("-inf") for i in range(vocab)]

    return fn


def batch(*sentences: list[int]) -> torch.Tensor:
    """Source ids (+EOS), right-padded: (B, S)."""
    width = max(len(s) for s in sentences) + 1
    return torch.tensor([[*s, EOS_ID] + [PAD_ID] * (width - len(s) - 1) for s in sentences])


SOURCES = [[7, 8, 9], [7], [9, 9, 8, 7, 7, 8], [8, 7]]


# --------------------------------------------------------------------------- toy tests


def test_beam_finds_the_sequence_greedy_misses():
    # Greedy takes A (0.5) and then EOS (0.3): p = 0.15. B (0.4) then EOS (0.9) is better: 0.36.
    table = {(): {A: 0.5, B: 0.4, C: 0.1}, (A,): {EOS_ID: 0.3, A: 0.25, B: 0.25, C: 0.2}, (B,): {EOS_ID: 0.9, A: 0.1}}
    model = ToyModel(7, table_fn(table, 7))
    src = batch([7, 7])
    assert greedy_search(model, src) == [[A]]
    hyps = beam_search(model, src, beam=2, nbest=2, len_penalty=0.0)[0]
    assert [h.tokens for h in hyps] == [[B], [A]]
    assert hyps[0].logprob == pytest.approx(math.log(0.36), abs=1e-5)
    assert hyps[1].logprob == pytest.approx(math.log(0.15), abs=1e-5)
    assert beam_search(model, src, beam=1)[0][0].tokens == [A]


@pytest.mark.parametrize("len_penalty", [0.0, 1.0, 2.0])
def test_wide_beam_equals_exhaustive_search(len_penalty):
    """With a beam wider than the tree, the n-best are exactly the best complete sequences."""
    vocab, src = 7, [8, 7, 9]
    model = ToyModel(vocab, random_fn(vocab, eos_rise=0.0))
    max_len = 3  # max_len_a=0, max_len_b=3
    every = [list(seq) for n in range(max_len + 1) for seq in itertools.product([A, B, C], repeat=n)]
    exact = sorted(((model.logprob(src, s) / (len(s) + 1) ** len_penalty, s) for s in every), key=lambda x: -x[0])
    hyps = beam_search(
        model, batch(src), beam=64, nbest=5, len_penalty=len_penalty, max_len_a=0, max_len_b=3, min_len=0
    )[0]
    assert [h.tokens for h in hyps] == [s for _, s in exact[:5]]
    assert [h.score for h in hyps] == pytest.approx([x for x, _ in exact[:5]], abs=1e-4)
    for h in hyps:
        assert h.logprob == pytest.approx(model.logprob(src, h.tokens), abs=1e-4)


def test_beam_one_equals_greedy_on_toy():
    model = ToyModel(12, random_fn(12))
    src = batch(*SOURCES)
    greedy = greedy_search(model, src, max_len_a=1.0, max_len_b=4)
    beam = beam_search(model, src, beam=1, max_len_a=1.0, max_len_b=4)
    assert [h[0].tokens for h in beam] == greedy
    assert any(len(g) > 1 for g in greedy)


def test_nbest_sorted_and_distinct():
    model = ToyModel(12, random_fn(12))
    for hyps in beam_search(model, batch(*SOURCES), beam=6, nbest=6, len_penalty=1.0):
        assert len(hyps) == 6
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 6
        for h in hyps:
            assert h.score == pytest.approx(h.logprob / (len(h.tokens) + 1), abs=1e-5)
            assert EOS_ID not in h.tokens and BOS_ID not in h.tokens and PAD_ID not in h.tokens


@pytest.mark.invariance
def test_toy_batch_invariance():
    model = ToyModel(12, random_fn(12))
    together_g = greedy_search(model, batch(*SOURCES))
    together_b = beam_search(model, batch(*SOURCES), beam=3, nbest=3)
    for i, s in enumerate(SOURCES):
        assert greedy_search(model, batch(s)) == [together_g[i]]
        alone = beam_search(model, batch(s), beam=3, nbest=3)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in together_b[i]]


def test_min_len_forbids_early_eos():
    eager = ToyModel(8, lambda src, prefix: [0.0, 0, 0, 5.0, 1.0, 0.5, 0, 0])  # EOS first choice
    src = batch([7, 7, 7])
    assert greedy_search(eager, src, min_len=0) == [[]]
    assert greedy_search(eager, src, min_len=3) == [[A, A, A]]
    for h in beam_search(eager, src, beam=3, nbest=3, min_len=3)[0]:
        assert len(h.tokens) >= 3
    assert beam_search(eager, src, beam=3, min_len=3)[0][0].tokens == [A, A, A]


def test_max_len_per_sentence():
    never_eos = ToyModel(8, lambda src, prefix: [0.0, 0, 0, -9.0, 1.0, 0.5, 0, 0])
    src = batch([7], [7, 7, 7, 7], [7, 7])  # max_len = floor(1.5 * n + 2) = 3, 8, 5
    assert [len(g) for g in greedy_search(never_eos, src, max_len_a=1.5, max_len_b=2)] == [3, 8, 5]
    beams = beam_search(never_eos, src, beam=2, nbest=2, max_len_a=1.5, max_len_b=2)
    assert [[len(h.tokens) for h in hyps] for hyps in beams] == [[3, 3], [8, 8], [5, 5]]
    # the model's own limit wins over a generous max_len
    capped = ToyModel(8, never_eos.fn, max_positions=4)
    assert [len(g) for g in greedy_search(capped, src, max_len_a=1.5, max_len_b=2)] == [3, 3, 3]


def test_pad_and_bos_never_generated():
    likes_specials = ToyModel(8, lambda src, prefix: [9.0, 5.0, 9.0, -1.0, 1.0, 0, 0, 0], specials=True)
    src = batch([7, 7])  # max_len = 3
    assert greedy_search(likes_specials, src, max_len_a=0.5, max_len_b=2) == [[UNK_ID] * 3]
    for h in beam_search(likes_specials, src, beam=3, nbest=3, max_len_a=0.5, max_len_b=2)[0]:
        assert PAD_ID not in h.tokens and BOS_ID not in h.tokens


def _ngrams(seq: list[int], n: int) -> list[tuple]:
    return [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram(n):
    # always prefers A, then B, then C, ...: without the rule the output is A A A ...
    repeat = ToyModel(12, lambda src, prefix: [0.0, 0, 0, -5.0] + [3.0 - 0.3 * i for i in range(8)])
    src = batch([7, 7, 7, 7])
    free = beam_search(repeat, src, beam=2, max_len_a=1.0, max_len_b=4)[0][0].tokens
    assert free == [A] * 8
    for h in beam_search(repeat, src, beam=2, nbest=2, max_len_a=1.0, max_len_b=4, no_repeat_ngram=n)[0]:
        assert len(h.tokens) == 8
        grams = _ngrams(h.tokens, n)
        assert len(grams) == len(set(grams)), h.tokens


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_in_greedy_and_sampling(n):
    """Greedy search (and sampling, which shares its loop) never repeats an n-gram; 0 is off."""
    repeat = ToyModel(12, lambda src, prefix: [0.0, 0, 0, -5.0] + [3.0 - 0.3 * i for i in range(8)])
    src = batch([7, 7, 7, 7], [8, 8])
    assert greedy_search(repeat, src, max_len_a=1.0, max_len_b=4, no_repeat_ngram=0) == [[A] * 8, [A] * 6]
    for draw in (None, Sampling(topk=3, seed=n)):
        for out in greedy_search(repeat, src, max_len_a=1.0, max_len_b=4, sampling=draw, no_repeat_ngram=n):
            grams = _ngrams(out, n)
            assert len(out) >= 6 and len(grams) == len(set(grams)), out


def test_no_repeat_ngram_zero_leaves_every_search_unchanged():
    model = ToyModel(12, random_fn(12))
    src = batch(*SOURCES)
    assert greedy_search(model, src, no_repeat_ngram=0) == greedy_search(model, src)
    plain, off = (beam_search(model, src, beam=3, nbest=3, **kw) for kw in ({}, {"no_repeat_ngram": 0}))
    assert [[(h.tokens, h.score) for h in row] for row in plain] == [[(h.tokens, h.score) for h in row] for row in off]


def test_finished_sentences_leave_the_batch():
    """A short sentence done early must not keep decoding: steps are bounded by the longest."""
    never_eos = ToyModel(8, lambda src, prefix: [0.0, 0, 0, -9.0, 1.0, 0.5, 0, 0])
    greedy_search(never_eos, batch([7], [7] * 6), max_len_a=1.0, max_len_b=0)
    assert never_eos.steps == 7  # 6 tokens + the forced EOS


def test_hypothesis_fields():
    h = beam_search(ToyModel(12, random_fn(12)), batch([7, 8]), beam=2)[0][0]
    assert isinstance(h, Hypothesis)
    assert isinstance(h.tokens, list) and all(isinstance(t, int) for t in h.tokens)
    assert h.logprob <= 0 and math.isfinite(h.score)


# --------------------------------------------------------------------------- the real Transformer


def _tiny_transformer(vocab: int = 20, seed: int = 0):
    from nmt.config import ModelConfig
    from nmt.model.transformer import Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(
        d_model=32, heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=64, dropout=0.0, max_positions=64
    )
    return Transformer(cfg, vocab, vocab)


def _reverse_batch(n: int, gen: torch.Generator, vocab: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Toy task: target = reversed source. Returns src (B, S), tgt_in (B, T), tgt_out (B, T)."""
    seqs = [torch.randint(4, vocab, (int(torch.randint(2, 7, (1,), generator=gen)),), generator=gen) for _ in range(n)]
    srcs = [s.tolist() for s in seqs]
    src = batch(*srcs)
    width = src.size(1)
    tgt_in = torch.tensor([[BOS_ID, *s[::-1]] + [PAD_ID] * (width - len(s) - 1) for s in srcs])
    tgt_out = torch.tensor([[*s[::-1], EOS_ID] + [PAD_ID] * (width - len(s) - 1) for s in srcs])
    return src, tgt_in, tgt_out


@pytest.fixture(scope="module")
@trains
def trained_transformer():
    """A tiny Transformer trained briefly (a few seconds) to reverse its input: 400 updates, warm-up
    then cosine decay from 1e-2, so that it ends settled whatever the seed and kernels (at a constant
    3e-3 for 250 updates it solved 42-82 of 100 held-out sentences over six seeds)."""
    model = _tiny_transformer(seed=TEST_SEED)
    steps, warmup = 400, 30
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    decay = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * i / steps))
    )
    gen = torch.Generator().manual_seed(TEST_SEED)
    model.train()
    for _ in range(steps):
        src, tgt_in, tgt_out = _reverse_batch(32, gen)
        loss = torch.nn.functional.cross_entropy(model(src, tgt_in).transpose(1, 2), tgt_out, ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
        decay.step()
    return model.eval()


def _sequence_logprob(model, src: list[int], tokens: list[int]) -> float:
    """Teacher-forced sum of the model's log-probs of tokens + EOS."""
    with torch.no_grad():
        logits = model(batch(src), torch.tensor([[BOS_ID, *tokens]]))[0].float()  # (T, V)
    lp = torch.log_softmax(logits, -1)
    return float(lp[torch.arange(len(tokens) + 1), torch.tensor([*tokens, EOS_ID])].sum())


REAL_SOURCES = [[5, 9, 12], [7, 4, 4, 18, 6, 11], [13, 5], [8, 8, 9, 10, 15], [19, 4, 6, 7]]


@pytest.mark.invariance
@pytest.mark.slow
def test_beam_one_equals_greedy_on_transformer(trained_transformer):
    for model in (_tiny_transformer(seed=3).eval(), trained_transformer):
        src = batch(*REAL_SOURCES)
        greedy = greedy_search(model, src)
        assert [h[0].tokens for h in beam_search(model, src, beam=1)] == greedy
        assert [h[0].tokens for h in beam_search(model, src, beam=1, len_penalty=0.0)] == greedy


@pytest.mark.learning
@pytest.mark.slow
def test_trained_transformer_learned_the_task(trained_transformer):
    """Guards the next tests: on a model that did not learn, they would prove little. The figure:
    how many of 100 held-out sources it reverses exactly (greedy)."""
    src, _, _ = _reverse_batch(100, torch.Generator().manual_seed(99))
    rows = [[t for t in row if t not in (PAD_ID, EOS_ID)] for row in src.tolist()]
    solved = sum(out == row[::-1] for out, row in zip(greedy_search(trained_transformer, src), rows, strict=True))
    assert_learned("reverse-400/solved_of_100", solved, 75)


@pytest.mark.parametrize("len_penalty", [0.0, 1.0])
@pytest.mark.slow
def test_beam_scores_at_least_greedy(trained_transformer, len_penalty):
    """Beam search beats greedy in score, on the whole. Not sentence by sentence: a sentence stops
    once it holds `beam` finished hypotheses (fairseq's rule), so a longer, better greedy output
    can still be open then (1 of 12 here with the model trained on an Intel Xeon; 0 of 432 over
    6 models on an AMD EPYC)."""
    model = trained_transformer
    gen = torch.Generator().manual_seed(7)
    src, _, _ = _reverse_batch(12, gen)
    greedy = greedy_search(model, src)
    beams = beam_search(model, src, beam=4, nbest=4, len_penalty=len_penalty)
    margins = []
    for row, g, hyps in zip(src.tolist(), greedy, beams, strict=True):
        s = [t for t in row if t not in (PAD_ID, EOS_ID)]
        g_score = _sequence_logprob(model, s, g) / (len(g) + 1) ** len_penalty
        margins.append(hyps[0].score - g_score)
        for h in hyps:  # search scores agree with a teacher-forced forward pass
            assert h.logprob == pytest.approx(_sequence_logprob(model, s, h.tokens), abs=1e-3)
            assert h.score == pytest.approx(h.logprob / (len(h.tokens) + 1) ** len_penalty, abs=1e-5)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert sum(m >= -1e-4 for m in margins) >= 9  # a broken search loses on most


@pytest.mark.invariance
@pytest.mark.parametrize("trained", [False, True])
@pytest.mark.slow
def test_transformer_batch_invariance(trained_transformer, trained):
    model = trained_transformer if trained else _tiny_transformer(seed=5).eval()
    together = batch(*REAL_SOURCES)
    g_all = greedy_search(model, together)
    b_all = beam_search(model, together, beam=3, nbest=3, no_repeat_ngram=2)
    for i, s in enumerate(REAL_SOURCES):
        assert greedy_search(model, batch(s)) == [g_all[i]]
        alone = beam_search(model, batch(s), beam=3, nbest=3, no_repeat_ngram=2)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in b_all[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in b_all[i]], abs=1e-4)


@pytest.mark.invariance
@pytest.mark.slow
def test_batch_invariance_with_encoder_length_groups(trained_transformer, monkeypatch):
    """A batch mixing long and short sources is encoded in length groups (`encode_by_length`);
    each sentence still decodes exactly as it does alone."""
    gen = torch.Generator().manual_seed(11)
    sources = [torch.randint(4, 20, (n,), generator=gen).tolist() for n in (2, 18, 3, 16, 17, 2, 4, 15, 3, 19)]
    together = batch(*sources)
    groups: list[int] = []
    plain = trained_transformer.encode
    monkeypatch.setattr(trained_transformer, "encode", lambda src: groups.append(src.size(0)) or plain(src))
    b_all = beam_search(trained_transformer, together, beam=3, nbest=2)
    g_all = greedy_search(trained_transformer, together)
    assert groups == [5, 5, 5, 5]  # each search: the long and the short half, encoded apart
    for i, s in enumerate(sources):
        assert greedy_search(trained_transformer, batch(s)) == [g_all[i]]
        alone = beam_search(trained_transformer, batch(s), beam=3, nbest=2)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in b_all[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in b_all[i]], abs=1e-4)


TIE = 1e-3  # a score margin below this between the best two hypotheses is a tie that rounding may flip


@pytest.mark.invariance
@pytest.mark.parametrize("trained", [False, True])
@pytest.mark.slow
def test_batch_invariance_across_the_step_kernel_switch(trained_transformer, trained, monkeypatch):
    """A batch of enough sentences that the beams' cross-attention runs the written-out kernel
    (`QUERY_BLOCKS_FOR_MATH` (sentence × head) blocks) decodes as each sentence alone, which runs
    the fused one: every score equal to 1e-4, and the same best tokens wherever the best two
    hypotheses are more than `TIE` apart (below that, the kernels' rounding may order a tie
    either way)."""
    from nmt.model import attention

    model = trained_transformer if trained else _tiny_transformer(seed=5).eval()
    heads = model.cfg.heads
    kernels: list[str] = []
    choose = attention.step_kernel
    monkeypatch.setattr(attention, "step_kernel", lambda q: kernels.append(choose(q)) or kernels[-1])
    gen = torch.Generator().manual_seed(21)
    n = attention.QUERY_BLOCKS_FOR_MATH // heads + 4
    sources = [
        torch.randint(4, 20, (int(torch.randint(2, 8, (1,), generator=gen)),), generator=gen).tolist() for _ in range(n)
    ]
    together = beam_search(model, batch(*sources), beam=3, nbest=3)
    assert "math" in kernels, "the batch never reached the written-out kernel"
    decided = 0
    for i, s in enumerate(sources):
        kernels.clear()
        alone = beam_search(model, batch(s), beam=3, nbest=3)[0]
        assert "math" not in kernels
        assert [h.score for h in alone] == pytest.approx([h.score for h in together[i]], abs=1e-4)
        if alone[0].score - alone[1].score > TIE:
            decided += 1
            assert alone[0].tokens == together[i][0].tokens, f"sentence {i}"
    assert decided >= n // 2, "too many ties: the test would prove little"


def test_transformer_respects_max_positions():
    model = _tiny_transformer().eval()  # max_positions = 64
    src = batch([5] * 50)  # 1.5 * 50 + 10 = 85 > 63
    assert len(greedy_search(model, src, min_len=200)[0]) == 63
    assert len(beam_search(model, src, beam=2, min_len=200)[0][0].tokens) == 63


def test_beam_step_zero_runs_once_per_sentence():
    rows_per_step: list[int] = []
    model = ToyModel(12, random_fn(12))
    decode_step = model.decode_step
    model.decode_step = lambda tokens, state: rows_per_step.append(tokens.numel()) or decode_step(tokens, state)
    src = batch(*SOURCES)
    hyps = beam_search(model, src, beam=3, max_len_a=1.0, max_len_b=4)
    assert rows_per_step[0] == src.size(0) and rows_per_step[1] == 3 * src.size(0)
    assert all(h for h in hyps)


class _UncachedState:
    """Each row's source and generated prefix; nothing is cached."""

    def __init__(self, src: torch.Tensor):
        self.src, self.prefix = src, torch.full((src.size(0), 1), BOS_ID)  # (R, S), (R, 1 + t)

    def reorder(self, index: torch.Tensor, sentences: torch.Tensor | None = None, beam: int | None = None) -> None:
        self.src, self.prefix = self.src.index_select(0, index), self.prefix.index_select(0, index)


class Uncached:
    """The plain path: every step re-runs the teacher-forced `model(src, prefix)` on the whole
    prefix (full-sequence attention, no KV cache, no shared source rows, no preallocation)."""

    def __init__(self, model):
        self.model, self.max_positions = model, model.max_positions

    def encode(self, src: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(src=src)

    def start_decoding(self, enc: SimpleNamespace) -> _UncachedState:
        return _UncachedState(enc.src)

    def decode_step(self, tokens: torch.Tensor, state: _UncachedState) -> torch.Tensor:
        if state.prefix.size(1) > 1 or bool((tokens != BOS_ID).any()):
            state.prefix = torch.cat([state.prefix, tokens[:, None]], dim=1)
        return self.model(state.src, state.prefix)[:, -1].float()  # (R, V)


@pytest.mark.invariance
@pytest.mark.parametrize("trained", [False, True])
@pytest.mark.slow
def test_cached_search_equals_the_plain_path(trained_transformer, trained):
    """The fast decoder (preallocated cache, beams sharing their sentence's source, in-place
    reorders, argmax of logits in greedy) finds exactly what full re-computation finds."""
    model = trained_transformer if trained else _tiny_transformer(seed=5).eval()
    src, _, _ = _reverse_batch(12, torch.Generator().manual_seed(3))
    plain = Uncached(model)
    assert greedy_search(model, src) == greedy_search(plain, src)
    assert greedy_search(model, src, no_repeat_ngram=2) == greedy_search(plain, src, no_repeat_ngram=2)
    for beam, nbest in ((1, 1), (4, 4), (5, 2)):
        fast, ref = (beam_search(m, src, beam=beam, nbest=nbest, no_repeat_ngram=3) for m in (model, plain))
        assert [[h.tokens for h in row] for row in fast] == [[h.tokens for h in row] for row in ref]
        for f_row, r_row in zip(fast, ref, strict=True):
            assert [h.score for h in f_row] == pytest.approx([h.score for h in r_row], abs=1e-4)


@pytest.mark.invariance
@pytest.mark.parametrize("batch", [1, 3, 16])
@pytest.mark.slow
def test_converted_fp32_search_equals_the_plain_path(trained_transformer, batch):
    """The decoding model as the native engine runs it in fp32 (packed linear layers, one-row
    matrix-vector products when a sentence is decoded alone, one fused attention call per step)
    finds what full re-computation with the unconverted model finds: the same tokens, the same
    scores up to rounding, for greedy and beam search, whatever the batch size."""
    import copy

    from nmt.model.convert import inference_model

    fast = inference_model(copy.deepcopy(trained_transformer), torch.device("cpu"), "fp32")
    plain = Uncached(trained_transformer)
    src, _, _ = _reverse_batch(16, torch.Generator().manual_seed(6))
    for rows in src.split(batch):
        rows = rows[:, : int((rows != PAD_ID).sum(1).max())]  # no column of padding only
        assert greedy_search(fast, rows) == greedy_search(plain, rows)
        for beam in (1, 4):
            got, want = (beam_search(m, rows, beam=beam, nbest=min(beam, 2)) for m in (fast, plain))
            assert [[h.tokens for h in row] for row in got] == [[h.tokens for h in row] for row in want]
            for g_row, w_row in zip(got, want, strict=True):
                assert [h.score for h in g_row] == pytest.approx([h.score for h in w_row], abs=1e-4)


@pytest.mark.precision
@pytest.mark.int8
@pytest.mark.slow
def test_decoding_precisions_on_the_trained_transformer(trained_transformer):
    """Packed fp32 finds exactly what the plain model finds; bf16 and int8 (weights converted
    once by the native engine) mostly agree with it and still solve the task."""
    import copy

    from nmt.model.convert import inference_model

    src, _, _ = _reverse_batch(16, torch.Generator().manual_seed(4))
    expected = greedy_search(trained_transformer, src)
    beams = [h[0].tokens for h in beam_search(trained_transformer, src, beam=4)]
    for precision, least in (("fp32", 16), ("bf16", 13), ("int8", 13)):
        model = inference_model(copy.deepcopy(trained_transformer), torch.device("cpu"), precision)
        assert sum(a == b for a, b in zip(greedy_search(model, src), expected, strict=True)) >= least, precision
        found = [h[0].tokens for h in beam_search(model, src, beam=4)]
        assert sum(a == b for a, b in zip(found, beams, strict=True)) >= least, precision


@pytest.mark.slow
def test_on_done_reports_each_sentence_once_as_it_finishes(trained_transformer):
    heard: list[tuple[int, list]] = []
    src = batch(*REAL_SOURCES)
    out = beam_search(trained_transformer, src, beam=3, nbest=2, on_done=lambda b, hyps: heard.append((b, hyps)))
    assert sorted(b for b, _ in heard) == list(range(len(REAL_SOURCES)))
    assert all(hyps == out[b] for b, hyps in heard)
    lengths = [len(out[b][0].tokens) for b, _ in heard]
    assert lengths[0] <= lengths[-1]  # in finishing order: a short output is heard before a long one
