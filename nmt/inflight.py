"""Beam search that sentences join while it runs (continuous batching, for a server).

`beam_search` (nmt/search.py) decodes a batch until its last sentence is done. A server's batches
are small and unsorted, so for most of their steps only a few sentences are left, and a step
costs much the same for 2 sentences as for 16 (on a CPU its fixed part — weights read once,
a few hundred small ops — is about as large as the work of 10 rows). `InflightBeam` keeps one
batch running instead: `add` puts new sentences into it at any step, `step` advances every live
sentence by one token and hands each finished sentence to its callback at once.

How sentences at different positions share a step: each sentence counts its own output position
(`age`), the decoder state keeps each sentence's first cache position (`DecoderState.join`), so
a row's position embedding is its own and its self-attention masks the cache positions written
before it joined. A new sentence enters with `beam` rows of which only the first is open (the
others score -inf), which is what `beam_search`'s first step computes with one row. The rules
and scores are `beam_search`'s (the same helpers), so the results are those of decoding each
sentence alone, up to the last-bit effects of padding that batching already has.

Not covered (callers decode those with `beam_search`): `no_repeat_ngram`, and engines other
than the native model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nmt import BOS_ID, PAD_ID
from nmt.search import (
    NEG_INF,
    Hypothesis,
    _collect,
    _Finished,
    _finish_eos,
    _log_probs,
    _next_beams,
    constrain,
    max_lengths,
)

Done = Callable[[list[Hypothesis]], None]  # a sentence's hypotheses, best first


@dataclass(frozen=True)
class BeamSettings:
    """What every sentence of one in-flight batch shares (`beam_search`'s arguments)."""

    beam: int = 5
    nbest: int = 1
    len_penalty: float = 1.0
    max_len_a: float = 1.5
    max_len_b: float = 10
    min_len: int = 1


@dataclass
class _Live:
    """The live sentences, N of them with K rows each, in one order throughout."""

    done: list[Done]  # (N) callbacks
    age: Tensor  # (N,) long: the output position of the next token
    max_len: Tensor  # (N,) long
    scores: Tensor  # (N, K)
    hist: Tensor  # (N*K, T) tokens so far at their output positions, PAD after
    tokens: Tensor  # (N*K,) the token each row feeds to the next step
    fin: _Finished  # (N, K) finished hypotheses, tokens (N, K, T)


class InflightBeam:
    """One model's running batch; `add` and `step` are called from one thread."""

    def __init__(self, model: Any, settings: BeamSettings, device: torch.device | str = "cpu") -> None:
        if settings.beam < 1 or not 1 <= settings.nbest <= settings.beam:
            raise ValueError(f"need beam >= 1 and 1 <= nbest <= beam, got {settings}")
        self.model, self.s, self.device = model, settings, torch.device(device)
        self.state: Any = None  # the model's DecoderState
        self.live: _Live | None = None

    def __len__(self) -> int:
        return 0 if self.live is None else len(self.live.done)

    @torch.inference_mode()
    def add(self, src: Tensor, done: list[Done]) -> None:
        """Sentences `src` (B, S) (ids + EOS, right-padded with PAD) join at the next step; `done[b]`
        hears sentence b's hypotheses when it is finished (from `step`)."""
        B, K = src.size(0), self.s.beam
        if B == 0:
            return
        state = self.model.start_decoding(self.model.encode(src))
        state.reorder(torch.arange(B, device=src.device).repeat_interleave(K), beam=K)  # nothing cached yet
        max_len = max_lengths(self.model, src, self.s.max_len_a, self.s.max_len_b)  # (B,)
        T = int(max_len.max()) + 1
        scores = torch.full((B, K), NEG_INF, device=src.device)
        scores[:, 0] = 0.0  # one open beam per new sentence
        hist = torch.full((B * K, T), PAD_ID, dtype=torch.long, device=src.device)
        tokens = torch.full((B * K,), BOS_ID, dtype=torch.long, device=src.device)
        new = _Live(list(done), torch.zeros_like(max_len), max_len, scores, hist, tokens, _Finished.empty(B, K, T, src.device))
        if self.live is None:
            self.state, self.live = state, new
            return
        self.state.join(state)
        self.live = _concat(self.live, new)

    @torch.inference_mode()
    def step(self) -> None:
        """One token for every live sentence; finished sentences leave and hear their results."""
        live, s = self.live, self.s
        if live is None:
            return
        N, K = live.scores.shape
        position = live.age.repeat_interleave(K)  # (N*K,)
        lp = constrain(_log_probs(self.model, live.tokens, self.state), position, s.min_len, live.max_len.repeat_interleave(K))
        V = lp.size(1)
        cand = (live.scores.view(-1, 1) + lp).view(N, K * V)  # (N, K*V)
        top_score, top_idx = cand.topk(2 * K, dim=1)  # (N, 2K)
        top_beam, top_tok = top_idx // V, top_idx % V
        fin = _finish_eos(live.fin, top_score[:, :K], top_beam[:, :K], top_tok[:, :K], live.hist, live.age, s.len_penalty)
        scores, flat, tokens = _next_beams(top_score, top_beam, top_tok, K, K)  # (N, K), (N*K,), (N*K,)
        full = torch.isfinite(fin.score).sum(dim=1) >= K  # (N,)
        stuck = ~torch.isfinite(scores).any(dim=1)
        done = full | stuck | (live.age >= live.max_len)
        hist = live.hist[flat]
        hist[torch.arange(N * K, device=hist.device), position] = tokens
        live = _Live(live.done, live.age + 1, live.max_len, scores, hist, tokens, fin)
        keep = None
        if bool(done.any()):
            finished = done.nonzero().squeeze(1)
            for n, hyps in zip(finished.tolist(), _collect(fin.select(finished), s.nbest), strict=True):
                live.done[n](hyps)
            keep = (~done).nonzero().squeeze(1)  # (N',)
            if keep.numel() == 0:
                self.state, self.live = None, None
                return
            flat = flat.view(N, K)[keep].view(-1)
            live = _select(live, keep, K)
        self.state.reorder(flat, sentences=keep)
        self.live = live


def _select(live: _Live, keep: Tensor, K: int) -> _Live:
    """The sentences `keep` (N',) of `live`, in that order."""
    rows = (keep[:, None] * K + torch.arange(K, device=keep.device)).view(-1)
    return _Live(
        [live.done[n] for n in keep.tolist()],
        live.age[keep],
        live.max_len[keep],
        live.scores[keep],
        live.hist[rows],
        live.tokens[rows],
        live.fin.select(keep),
    )


def _concat(a: _Live, b: _Live) -> _Live:
    """`a`'s sentences, then `b`'s; histories padded to the longer of the two."""
    T = max(a.hist.size(1), b.hist.size(1))
    return _Live(
        a.done + b.done,
        torch.cat([a.age, b.age]),
        torch.cat([a.max_len, b.max_len]),
        torch.cat([a.scores, b.scores]),
        torch.cat([_widen(a.hist, T), _widen(b.hist, T)]),
        torch.cat([a.tokens, b.tokens]),
        _Finished(
            torch.cat([a.fin.score, b.fin.score]),
            torch.cat([a.fin.logprob, b.fin.logprob]),
            torch.cat([_widen(a.fin.tokens, T), _widen(b.fin.tokens, T)]),
            torch.cat([a.fin.length, b.fin.length]),
        ),
    )


def _widen(t: Tensor, T: int) -> Tensor:
    """Token positions (last dimension) padded with PAD up to T."""
    if t.size(-1) == T:
        return t
    return torch.cat([t, t.new_full((*t.shape[:-1], T - t.size(-1)), PAD_ID)], dim=-1)
