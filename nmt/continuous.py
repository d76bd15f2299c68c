"""Continuous batching for beam search: sentences join a running search at any step and leave it
when they are done, so a server decodes a full batch all the time instead of waiting for the
longest sentence of each batch (iteration-level scheduling, Yu et al., "Orca", OSDI 2022).

    search = ContinuousSearch(model, settings)
    search.add(seqs, tags)            # source ids (no EOS), one tag each: encoded, live from the next step
    for tag, hyps in search.step():   # one decoding step of every live sentence → those it finished,
        ...                           # with their n-best (`nmt.search.Hypothesis`, best first)

Each sentence has `beam` rows from its first step (rows 1.. start closed, score -inf, so step 0
expands only row 0, as `beam_search`'s single row per sentence does) and its own step counter:
its rows write and read the KV cache at their own positions (`DecoderState.positions`, masked by
`nmt.masks.ragged_step_bias`), and the length rules and the length penalty use its own step.
Scoring, the stopping rule and the n-best are `nmt.search.beam_search`'s, so a sentence gets the
hypotheses `beam_search` gives it, whichever sentences share its steps (tests/test_continuous.py).
`no_repeat_ngram` is not supported here (the server then batches whole requests instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt import BOS_ID, EOS_ID, PAD_ID
from nmt.batching import pad_sources
from nmt.cache import DecoderState
from nmt.masks import cross_attention_bias, ragged_step_bias
from nmt.search import (
    NEG_INF,
    Finished,
    Hypothesis,
    add_finished,
    collect_nbest,
    constrain,
    log_probs,
    max_lengths,
    next_beams,
)


@dataclass(frozen=True)
class SearchSettings:
    """What every sentence of one continuous search shares (`beam_search`'s arguments)."""

    beam: int = 5
    nbest: int = 1
    len_penalty: float = 1.0
    max_len_a: float = 1.5
    max_len_b: float = 10
    min_len: int = 1


class ContinuousSearch:
    """A beam search over a changing set of sentences (see the module docstring)."""

    def __init__(self, model: Any, settings: SearchSettings, device: torch.device | str = "cpu") -> None:
        if settings.beam < 1 or not 1 <= settings.nbest <= settings.beam:
            raise ValueError(f"need beam >= 1 and 1 <= nbest <= beam, got {settings}")
        self.model, self.s, self.device = model, settings, torch.device(device)
        self._reset()

    def _reset(self) -> None:
        """No live sentence: the next `add` starts a new decoder state."""
        self.tags: list[Any] = []  # per live sentence (N)
        self.t: list[int] = []  # per live sentence: tokens decoded so far = its next output position
        self.state: DecoderState | None = None
        self.max_len = self.scores = self.tokens = self.hist = torch.empty(0)  # (N,), (N, K), (R,), (R, T)
        self.fin: Finished | None = None

    @property
    def live(self) -> int:
        """Sentences being decoded."""
        return len(self.tags)

    @torch.inference_mode()
    def add(self, seqs: list[list[int]], tags: list[Any]) -> None:
        """Encode `seqs` (non-empty source id lists without EOS); they decode from the next `step`."""
        if not seqs:
            return
        n, K, dev = len(seqs), self.s.beam, self.device
        src = pad_sources(seqs).to(dev)  # (n, S)
        state = self.model.start_decoding(self.model.encode(src))
        state.reorder(torch.arange(n, device=dev).repeat_interleave(K), beam=K)  # K rows per sentence
        max_len = max_lengths(self.model, src, self.s.max_len_a, self.s.max_len_b)  # (n,)
        steps = int(max_len.max()) + 1
        scores = torch.full((n, K), NEG_INF, device=dev)
        scores[:, 0] = 0.0  # one open beam at step 0
        tokens = torch.full((n * K,), BOS_ID, dtype=torch.long, device=dev)
        hist = torch.full((n * K, steps), PAD_ID, dtype=torch.long, device=dev)
        fin = Finished.empty(n, K, steps, dev)
        if self.state is None:
            self.state, self.max_len, self.scores, self.tokens, self.hist, self.fin = (
                state, max_len, scores, tokens, hist, fin)  # fmt: skip
        else:
            assert self.fin is not None
            _join(self.state, state)
            T = max(self.hist.size(1), steps)
            self.hist = torch.cat([_pad_last(self.hist, T, PAD_ID), _pad_last(hist, T, PAD_ID)])
            old = self.fin
            self.fin = Finished(
                torch.cat([old.score, fin.score]),
                torch.cat([old.logprob, fin.logprob]),
                torch.cat([_pad_last(old.tokens, T, PAD_ID), _pad_last(fin.tokens, T, PAD_ID)]),
                torch.cat([old.length, fin.length]),
            )
            self.max_len = torch.cat([self.max_len, max_len])
            self.scores, self.tokens = torch.cat([self.scores, scores]), torch.cat([self.tokens, tokens])
        self.tags += list(tags)
        self.t += [0] * n

    @torch.inference_mode()
    def step(self) -> list[tuple[Any, list[Hypothesis]]]:
        """One token for every live sentence; returns the sentences this step finished (and drops them)."""
        if self.state is None or self.fin is None:
            return []
        st, K, N, dev = self.state, self.s.beam, self.live, self.device
        t_sent = torch.tensor(self.t, device=dev)  # (N,)
        t_rows = t_sent.repeat_interleave(K)  # (R,)
        st.step = widest = max(self.t)
        ragged = min(self.t) != widest
        st.positions = t_rows if ragged else None
        st.self_bias = ragged_step_bias(t_rows, widest + 1) if ragged else None
        lp = log_probs(self.model, self.tokens, st)  # (R, V)
        lp = constrain(lp, t_rows, self.s.min_len, self.max_len.repeat_interleave(K))
        V = lp.size(1)
        cand = (self.scores.view(-1, 1) + lp).view(N, K * V)  # (N, K*V)
        top_score, top_idx = cand.topk(min(2 * K, K * V), dim=1)  # (N, 2K)
        top_beam, top_tok = top_idx // V, top_idx % V
        self.fin = _finish_eos(self.fin, top_score[:, :K], top_beam[:, :K], top_tok[:, :K], self.hist, self.t, self.s)
        scores, flat, tokens = next_beams(top_score, top_beam, top_tok, K, K)  # (N, K), (R,), (R,)
        done = (torch.isfinite(self.fin.score).sum(dim=1) >= K) | ~torch.isfinite(scores).any(dim=1)
        done |= t_sent >= self.max_len  # (N,)
        self.t = [t + 1 for t in self.t]
        finished: list[tuple[Any, list[Hypothesis]]] = []
        keep = None
        if bool(done.any()):
            gone = done.nonzero().squeeze(1)
            hyps = collect_nbest(self.fin.select(gone), self.s.nbest)
            finished = [(self.tags[i], h) for i, h in zip(gone.tolist(), hyps, strict=True)]
            keep = (~done).nonzero().squeeze(1)  # (N',)
            if keep.numel() == 0:
                self._reset()
                return finished
            kept = keep.tolist()
            self.tags, self.t = [self.tags[i] for i in kept], [self.t[i] for i in kept]
            scores, self.fin, self.max_len = scores[keep], self.fin.select(keep), self.max_len[keep]
            flat, tokens = flat.view(N, K)[keep].view(-1), tokens.view(N, K)[keep].view(-1)
            t_rows = t_rows.view(N, K)[keep].view(-1)
        self.hist = self.hist[flat]
        self.hist[torch.arange(flat.numel(), device=dev), t_rows] = tokens
        st.reorder(flat, sentences=keep, beam=K)
        self.scores, self.tokens = scores, tokens
        return finished


def _finish_eos(
    fin: Finished, score: Tensor, beam_idx: Tensor, tok: Tensor, hist: Tensor, t: list[int], s: SearchSettings
) -> Finished:
    """`nmt.search._finish_eos` with one step per sentence (`t`, on the host): store the EOS
    candidates among the top K (all (N, K)) as finished hypotheses of length t[n]."""
    is_eos = (tok == EOS_ID) & torch.isfinite(score)  # (N, K)
    if not bool(is_eos.any()):
        return fin
    N, K = score.shape
    denom = torch.tensor([float(step + 1) ** s.len_penalty for step in t], device=score.device)  # fp32, as a scalar
    norm = score / denom[:, None]  # length counts the EOS
    new_score = torch.where(is_eos, norm, torch.full_like(norm, NEG_INF))
    rows = (torch.arange(N, device=score.device).unsqueeze(1) * K + beam_idx).view(-1)  # (N*K,)
    new_tokens = hist[rows].view(N, K, -1).clone()  # (N, K, T)
    steps = torch.tensor(t, device=score.device)[:, None]  # (N, 1)
    new_tokens.masked_fill_(torch.arange(hist.size(1), device=score.device) >= steps[:, :, None], PAD_ID)
    return add_finished(fin, new_score, score, new_tokens, steps)


def _join(a: DecoderState, b: DecoderState) -> None:
    """Append the sentences of `b` (at step 0, `a.beam` rows each) to `a`, in place."""
    S = max(a.src_pad.size(1), b.src_pad.size(1))
    a.cross_k = [torch.cat([_pad_len(x, S), _pad_len(y, S)]) for x, y in zip(a.cross_k, b.cross_k, strict=True)]
    a.cross_v = [torch.cat([_pad_len(x, S), _pad_len(y, S)]) for x, y in zip(a.cross_v, b.cross_v, strict=True)]
    a.src_pad = torch.cat([_pad_last(a.src_pad, S, True), _pad_last(b.src_pad, S, True)])  # (N, S)
    a.cross_bias = cross_attention_bias(a.src_pad)
    if a.cross_empty is not None or b.cross_empty is not None:
        parts = [s.cross_empty for s in (a, b)]
        ones = [torch.ones(s.src_pad.size(0), 1, 1, 1, device=s.src_pad.device) for s in (a, b)]
        a.cross_empty = torch.cat([p if p is not None else o for p, o in zip(parts, ones, strict=True)])
    rows = a.self_kv.rows
    new = torch.zeros(b.self_kv.rows, dtype=torch.long, device=a.src_pad.device)  # any row: masked until written
    a.self_kv.select(torch.cat([torch.arange(rows, device=new.device), new]), a.step)


def _pad_last(x: Tensor, size: int, value: float | bool) -> Tensor:
    """Right-pad the last dimension of `x` to `size` with `value`."""
    return F.pad(x, (0, size - x.size(-1)), value=value) if x.size(-1) < size else x


def _pad_len(x: Tensor, size: int) -> Tensor:
    """(N, H, S, dk) → (N, H, size, dk), zeros after S (keys/values of padding, masked)."""
    return F.pad(x, (0, 0, 0, size - x.size(2))) if x.size(2) < size else x
