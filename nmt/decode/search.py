"""Batched greedy and beam search over the decoder's KV cache.

Both searches drive any model with the decoding protocol (`nmt.contracts.DecodingModel`; the
Transformer is one):

    enc = model.encode(src)                 # src (B, S): ids + [EOS], right-padded with PAD
                                            # (`model.encode_by_length(src)` where the model has it)
    state = model.start_decoding(enc)       # cross-attention K/V computed once; one row per sentence
    logits = model.decode_step(tok, state)  # tok (R,) → (R, V) fp32 logits; appends to the cache
    state.reorder(rows)                     # row r becomes old row rows[r], in place; with one row
                                            # per sentence this drops, permutes or repeats sentences
    state.reorder(rows, beam=K)             # B rows → B*K: K rows (beams) per sentence from now on
    state.reorder(rows, sentences=keep)     # beams: drop the sentences not in `keep` (N',); `rows`
                                            # are the kept sentences' rows; without `sentences`,
                                            # rows only move among the beams of their sentence

Lengths. `src_len` is the number of source pieces (non-PAD ids, without the EOS). The output
of sentence b has at most `max_len[b] = floor(max_len_a * src_len + max_len_b)` tokens before
its EOS (capped at `max_positions - 1` when the model exposes `max_positions`), and at least
`min_len` (EOS is forbidden before; `max_len` wins when the two conflict). PAD and BOS are
never generated. Outputs exclude BOS and EOS.

Beam scores are fairseq-style: a finished hypothesis with summed log-probability `S` and
length `L` (its tokens *plus* the EOS) scores `S / L**len_penalty`; `len_penalty=0` ranks by
`S` alone, larger values favour longer outputs. A sentence stops when it holds `beam` finished
hypotheses (fairseq's criterion; only EOS candidates ranked within the top `beam` of a step
are finished) or when it reaches its `max_len`, where every open beam is closed with EOS.
With that criterion `beam=1` yields exactly the greedy output.

Every step is vectorised over the whole batch (sentences × beams in one tensor); the only
per-sentence Python work is collecting a sentence's results once, when it is done. Sentences
that are done are dropped from the batch (`state.reorder`), so they stop costing compute;
greedy search drops its ended rows in groups (once they are a quarter of the batch), since a
drop copies the caches and an ended row costs only its share of the step.
Beam search runs step 0 once per sentence (all beams start from BOS) and expands to
sentences × beams with the first reorder; steps that only move beams leave the source side of
the state alone. Greedy search takes the argmax of the logits (log-softmax does not change it).
Results do not depend on the other sentences in the batch, up to floating-point rounding: some
kernels are chosen by the step's shape (one row or many, `nmt.model.attention.step_kernel`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt import BOS_ID, EOS_ID, PAD_ID
from nmt.contracts import DecodingModel, DecodingState
from nmt.decode.options import Sampling
from nmt.decode.token_sampling import sample_tokens, sentence_keys

NEG_INF = float("-inf")
_NEVER = torch.tensor([PAD_ID, BOS_ID])  # ids that are never generated
COMPACT_AT = 4  # greedy: rows that ended leave the batch once they are 1/COMPACT_AT of it


@dataclass
class Hypothesis:
    """One finished translation: piece ids without BOS/EOS, its search score and log-probability."""

    tokens: list[int]
    score: float  # logprob / (len(tokens) + 1) ** len_penalty
    logprob: float  # sum of token log-probabilities, EOS included


# --------------------------------------------------------------------------- shared helpers


def model_max_positions(model: DecodingModel) -> int | None:
    """The decoder's position limit, if the model exposes one (`max_positions` or `cfg.max_positions`)."""
    for owner in (model, getattr(model, "cfg", None), getattr(model, "config", None)):
        value = getattr(owner, "max_positions", None) if owner is not None else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def max_lengths(model: DecodingModel, src: Tensor, max_len_a: float, max_len_b: float) -> Tensor:
    """(B,) long: the most output tokens (EOS excluded) allowed for each sentence of `src` (B, S)."""
    src_len = ((src != PAD_ID).sum(dim=1) - 1).clamp(min=0).double()  # (B,) pieces without EOS
    limit = (max_len_a * src_len + max_len_b).floor().long()
    cap = model_max_positions(model)
    if cap is not None:
        limit = limit.clamp(max=cap - 1)  # BOS + max_len inputs fit in max_positions
    return limit.clamp(min=0)


def constrain(lp: Tensor, step: int, min_len: int, max_len: Tensor, earliest_max: int = 0) -> Tensor:
    """Apply the length rules to log-probs (or logits) `lp` (R, V) of the token at output position `step`.

    `max_len` (R,) is each row's limit: a row with `step >= max_len` can only emit EOS. The rule is
    skipped while `step < earliest_max` (a lower bound of `max_len`, known on the host).
    """
    eos_lp = lp[:, EOS_ID].clone() if step >= earliest_max else None  # (R,): max_len wins over min_len
    lp.index_fill_(1, _NEVER.to(lp.device), NEG_INF)  # PAD, BOS
    if step < min_len:
        lp[:, EOS_ID] = NEG_INF
    if eos_lp is not None:
        force = step >= max_len  # (R,): only EOS left (no host sync: masks, not branches)
        lp.masked_fill_(force.unsqueeze(1), NEG_INF)
        lp[:, EOS_ID] = torch.where(force, eos_lp, lp[:, EOS_ID])
    return lp


def block_repeated_ngrams(lp: Tensor, hist: Tensor, n: int) -> Tensor:
    """Forbid tokens that would repeat an n-gram already in each row's history.

    lp (R, V) log-probs; hist (R, t) generated tokens so far (no BOS).
    """
    t = hist.size(1)
    if n <= 0 or t < n:
        return lp
    grams = hist.unfold(1, n, 1)  # (R, G, n), G = t - n + 1
    tail = hist[:, t - n + 1 :] if n > 1 else hist[:, :0]  # (R, n-1)
    match = (grams[:, :, :-1] == tail.unsqueeze(1)).all(dim=-1)  # (R, G)
    banned = torch.where(match, grams[:, :, -1], torch.full_like(grams[:, :, -1], PAD_ID))  # (R, G)
    return lp.scatter(1, banned, NEG_INF)


def _encode(model: DecodingModel, src: Tensor) -> Tensor:
    """The encoder output for `src` (B, S), by length groups where the model can (less padding)."""
    return getattr(model, "encode_by_length", model.encode)(src)


def _log_probs(model: DecodingModel, tokens: Tensor, state: DecodingState) -> Tensor:
    logits = model.decode_step(tokens, state)  # (R, V)
    if getattr(model, "decodes_log_probs", False):  # an ensemble's mean log-probabilities, used as they are
        return logits
    return torch.log_softmax(logits.float(), dim=-1)


# --------------------------------------------------------------------------- greedy


@torch.inference_mode()
def greedy_search(
    model: DecodingModel,
    src: Tensor,
    max_len_a: float = 1.5,
    max_len_b: float = 10,
    min_len: int = 1,
    *,
    sampling: Sampling | None = None,
    no_repeat_ngram: int = 0,
) -> list[list[int]]:
    """Most probable next token at every step, for a batch `src` (B, S). Returns B token lists.
    With `sampling`, each next token is drawn instead (`nmt.decode.token_sampling`; the same lengths).
    `no_repeat_ngram` n > 0: a token that would repeat an n-gram of the row's output is never
    chosen (nor drawn), as in beam search; 0 = off."""
    B = src.size(0)
    max_len = max_lengths(model, src, max_len_a, max_len_b)  # (B,)
    steps = int(max_len.max().item()) + 1 if B else 0
    earliest = int(max_len.min().item()) if B else 0
    out = torch.full((B, steps), PAD_ID, dtype=torch.long, device=src.device)  # (B, T)
    state = model.start_decoding(_encode(model, src))
    rows = torch.arange(B, device=src.device)  # original index of each row still decoded
    tokens = torch.full((B,), BOS_ID, dtype=torch.long, device=src.device)  # (R,)
    ended = torch.zeros(B, dtype=torch.bool, device=src.device)  # (R,): has emitted EOS
    keys = sentence_keys(src) if sampling is not None else None  # (B,)
    for t in range(steps):
        logits = constrain(model.decode_step(tokens, state), t, min_len, max_len[rows], earliest)  # (R, V)
        if no_repeat_ngram:  # the history is a gather of the rows still decoded: only when asked
            logits = block_repeated_ngrams(logits, out[rows, :t], no_repeat_ngram)
        # (R,): the argmax (of the log-probs too), or a draw
        tokens = logits.argmax(dim=-1) if keys is None else sample_tokens(logits, sampling, keys[rows], t)
        out[rows, t] = tokens  # what an ended row writes after its EOS is cut by _strip
        ended |= tokens == EOS_ID
        n_ended = int(ended.sum())
        if n_ended == ended.numel():
            break
        if n_ended * COMPACT_AT >= ended.numel():  # drop ended rows once they are a quarter of the batch:
            keep = (~ended).nonzero().squeeze(1)  # fewer cache copies than dropping at every EOS
            state.reorder(keep)
            rows, tokens, ended = rows[keep], tokens[keep], ended[keep]
    return [_strip(seq) for seq in out.tolist()]


def _strip(seq: list[int]) -> list[int]:
    """Tokens up to (not including) the first EOS or PAD."""
    for i, tok in enumerate(seq):
        if tok in (EOS_ID, PAD_ID):
            return seq[:i]
    return seq


# --------------------------------------------------------------------------- beam


@dataclass
class _Finished:
    """The best `beam` finished hypotheses of each live sentence (score -inf = empty slot)."""

    score: Tensor  # (N, K) normalised score
    logprob: Tensor  # (N, K)
    tokens: Tensor  # (N, K, T) tokens, PAD after the end
    length: Tensor  # (N, K) tokens without EOS

    @classmethod
    def empty(cls, n: int, k: int, steps: int, device: torch.device) -> _Finished:
        return cls(
            torch.full((n, k), NEG_INF, device=device),
            torch.zeros(n, k, device=device),
            torch.full((n, k, steps), PAD_ID, dtype=torch.long, device=device),
            torch.zeros(n, k, dtype=torch.long, device=device),
        )

    def select(self, keep: Tensor) -> _Finished:
        return _Finished(self.score[keep], self.logprob[keep], self.tokens[keep], self.length[keep])


def _add_finished(fin: _Finished, new_score: Tensor, new_logprob: Tensor, new_tokens: Tensor, step: int) -> _Finished:
    """Merge new EOS hypotheses (N, K) of length `step` into `fin`, keeping the best K (stable)."""
    K = fin.score.size(1)
    score = torch.cat([fin.score, new_score], dim=1)  # (N, 2K)
    order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :K]  # (N, K)
    logprob = torch.cat([fin.logprob, new_logprob], dim=1).gather(1, order)
    length = torch.cat([fin.length, torch.full_like(fin.length, step)], dim=1).gather(1, order)
    tokens = torch.cat([fin.tokens, new_tokens], dim=1)  # (N, 2K, T)
    tokens = tokens.gather(1, order.unsqueeze(-1).expand(-1, -1, tokens.size(2)))
    return _Finished(score.gather(1, order), logprob, tokens, length)


def _open(score: Tensor) -> Tensor:
    """True where a beam score is a real one (NEG_INF marks closed slots; scores are never +inf or
    NaN): one comparison instead of `isfinite`'s several kernels, on every step."""
    return score > NEG_INF


def _collect(fin: _Finished, nbest: int) -> list[list[Hypothesis]]:
    """The n-best of each sentence in `fin`, best first (one device→host copy)."""
    scores, logprobs, lengths = fin.score.tolist(), fin.logprob.tolist(), fin.length.tolist()
    tokens = fin.tokens.tolist()
    out = []
    for n in range(len(scores)):
        keep = [k for k in range(len(scores[n])) if scores[n][k] != NEG_INF][:nbest]  # sorted already
        out.append([Hypothesis(tokens[n][k][: lengths[n][k]], scores[n][k], logprobs[n][k]) for k in keep])
    return out


@torch.inference_mode()
def beam_search(
    model: DecodingModel,
    src: Tensor,
    beam: int = 5,
    nbest: int = 1,
    len_penalty: float = 1.0,
    max_len_a: float = 1.5,
    max_len_b: float = 10,
    min_len: int = 1,
    no_repeat_ngram: int = 0,
    on_done: Callable[[int, list[Hypothesis]], None] | None = None,
) -> list[list[Hypothesis]]:
    """Beam search for a batch `src` (B, S); returns, per sentence, up to `nbest` hypotheses, best first.
    `on_done(b, hypotheses)` is called as soon as sentence b is done (before the batch is)."""
    if beam < 1 or not 1 <= nbest <= beam:
        raise ValueError(f"need beam >= 1 and 1 <= nbest <= beam, got beam={beam}, nbest={nbest}")
    B, K, dev = src.size(0), beam, src.device
    max_len = max_lengths(model, src, max_len_a, max_len_b)  # (B,)
    steps = int(max_len.max().item()) + 1 if B else 0
    earliest = int(max_len.min().item()) if B else 0
    state = model.start_decoding(_encode(model, src))  # B rows: step 0 runs once per sentence
    sent = torch.arange(B, device=dev)  # original index of each live sentence (N,)
    scores = torch.zeros(B, 1, device=dev)  # (N, k): k = 1 open beam at step 0, K afterwards
    hist = torch.full((B, steps), PAD_ID, dtype=torch.long, device=dev)  # (N*k, T)
    tokens = torch.full((B,), BOS_ID, dtype=torch.long, device=dev)  # (N*k,)
    fin = _Finished.empty(B, K, steps, dev)
    results: list[list[Hypothesis]] = [[] for _ in range(B)]
    for t in range(steps):
        N, k = scores.shape
        lp = constrain(_log_probs(model, tokens, state), t, min_len, max_len[sent].repeat_interleave(k), earliest)
        lp = block_repeated_ngrams(lp, hist[:, :t], no_repeat_ngram)  # (N*k, V)
        top_score, top_beam, top_tok = _candidates(lp, scores, K)  # (N, >= K) each
        fin = _finish_eos(fin, top_score[:, :K], top_beam[:, :K], top_tok[:, :K], hist, t, len_penalty)
        scores, flat, tokens = _next_beams(top_score, top_beam, top_tok, K, k)  # (N, K), (N*K,), (N*K,)
        full = _open(fin.score).sum(dim=1) >= K  # (N,)
        stuck = ~_open(scores).any(dim=1)  # every open beam was closed by the rules
        done = full | stuck | (t >= max_len[sent])
        keep = None
        if bool(done.any()):  # collect finished sentences and drop their rows
            finished = done.nonzero().squeeze(1)
            for b, hyps in zip(sent[finished].tolist(), _collect(fin.select(finished), nbest), strict=True):
                results[b] = hyps
                if on_done is not None:
                    on_done(b, hyps)
            keep = (~done).nonzero().squeeze(1)  # (N',)
            if keep.numel() == 0:
                break
            sent, scores, fin = sent[keep], scores[keep], fin.select(keep)
            flat, tokens = flat.view(N, K)[keep].view(-1), tokens.view(N, K)[keep].view(-1)
        hist = hist[flat]
        hist[:, t] = tokens
        state.reorder(flat, sentences=keep, beam=K)  # step 0: B → N*K rows; later: beams move
    return results


def _candidates(lp: Tensor, scores: Tensor, K: int) -> tuple[Tensor, Tensor, Tensor]:
    """The best min(2K, k*V) continuations of each sentence, at least K (closed slots at -inf when
    the vocabulary is smaller than the beam at step 0). lp (N*k, V) this step's log-probs, scores
    (N, k) the open beams' → scores, beams and tokens, each (N, >= K). Adds `scores` into `lp`
    in place (one (R, V) buffer less per step)."""
    (N, k), V = scores.shape, lp.size(1)
    cand = lp.add_(scores.view(-1, 1)).view(N, k * V)  # (N, k*V)
    top_score, top_idx = cand.topk(min(2 * K, k * V), dim=1)  # (N, 2K)
    if top_score.size(1) < K:
        fill = K - top_score.size(1)
        top_score = torch.cat([top_score, top_score.new_full((N, fill), NEG_INF)], dim=1)
        top_idx = torch.cat([top_idx, top_idx.new_full((N, fill), PAD_ID)], dim=1)  # beam 0, token PAD
    return top_score, top_idx // V, top_idx % V


def _finish_eos(
    fin: _Finished, score: Tensor, beam_idx: Tensor, tok: Tensor, hist: Tensor, step: int, len_penalty: float
) -> _Finished:
    """Store the EOS candidates among the top K of this step (all (N, K)) as finished hypotheses.
    `hist` (N*k, T) holds the k open beams of each sentence that `beam_idx` points into."""
    is_eos = (tok == EOS_ID) & _open(score)  # (N, K)
    if not bool(is_eos.any()):
        return fin
    N, K = score.shape
    norm = score / float(step + 1) ** len_penalty  # length counts the EOS
    new_score = torch.where(is_eos, norm, torch.full_like(norm, NEG_INF))
    k = hist.size(0) // N  # open beams per sentence before this step
    rows = (torch.arange(N, device=score.device).unsqueeze(1) * k + beam_idx).view(-1)  # (N*K,)
    new_tokens = hist[rows].view(N, K, -1).clone()  # (N, K, T)
    new_tokens[:, :, step:] = PAD_ID
    return _add_finished(fin, new_score, score, new_tokens, step)


def _next_beams(top_score: Tensor, top_beam: Tensor, top_tok: Tensor, K: int, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The best K non-EOS candidates of each sentence, in rank order.

    top_* are (N, 2K), sorted by score, `top_beam` indexing the k beams a sentence had before the
    step. Returns scores (N, K), the flat source row (among N*k) of each new beam (N*K,) and its
    new token (N*K,).
    """
    N, C = top_score.shape
    open_ = (top_tok != EOS_ID) & _open(top_score)  # (N, 2K)
    rank_key = open_.long() * (C - torch.arange(C, device=top_score.device))  # earlier rank → larger
    pick = rank_key.topk(K, dim=1).indices  # (N, K): open candidates first, in rank order
    scores = top_score.gather(1, pick)
    scores = torch.where(open_.gather(1, pick), scores, torch.full_like(scores, NEG_INF))
    beam_idx = top_beam.gather(1, pick)
    flat = (torch.arange(N, device=top_score.device).unsqueeze(1) * k + beam_idx).view(-1)
    tokens = top_tok.gather(1, pick).view(-1)
    # a closed slot (no open candidate left) gets PAD so it never looks like EOS to the n-gram rule
    tokens = torch.where(_open(scores.view(-1)), tokens, torch.full_like(tokens, PAD_ID))
    return scores, flat, tokens
