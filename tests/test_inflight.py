"""In-flight beam search: sentences that join a running batch get what they get alone; the state's join."""

from __future__ import annotations

import pytest
import torch
from test_search import _reverse_batch, _tiny_transformer, batch

from nmt.cache import DecoderState, KVCache
from nmt.inflight import BeamSettings, InflightBeam
from nmt.search import beam_search

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    """The tiny Transformer, trained a little (a reversal task) so that beams differ."""
    m = _tiny_transformer(seed=2)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(2)
    m.train()
    for _ in range(120):
        src, tgt_in, tgt_out = _reverse_batch(32, gen)
        loss = torch.nn.functional.cross_entropy(m(src, tgt_in).transpose(1, 2), tgt_out, ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return m.eval()


def _sources(n: int, seed: int) -> list[list[int]]:
    src, _, _ = _reverse_batch(n, torch.Generator().manual_seed(seed))
    return [[t for t in row if t > 3] for row in src.tolist()]


@pytest.mark.parametrize("settings", [BeamSettings(beam=4, nbest=2), BeamSettings(beam=3, len_penalty=0.0)])
def test_sentences_joining_at_any_step_get_their_results_alone(model, settings):
    sources = _sources(14, seed=3)
    s = settings
    alone = [beam_search(model, batch(x), s.beam, s.nbest, s.len_penalty, s.max_len_a, s.max_len_b)[0] for x in sources]
    found: dict[int, list] = {}
    search = InflightBeam(model, settings)
    pending, joins, steps = list(range(len(sources))), [3, 0, 2, 1, 0, 4, 1, 3], 0
    while pending or len(search):
        take = pending[: joins[steps % len(joins)]]
        pending = pending[len(take) :]
        if take:
            search.add(batch(*(sources[i] for i in take)), [lambda h, i=i: found.__setitem__(i, h) for i in take])
        search.step()
        steps += 1
    assert sorted(found) == list(range(len(sources)))
    for i, hyps in enumerate(alone):
        assert [h.tokens for h in found[i]] == [h.tokens for h in hyps]
        assert [h.score for h in found[i]] == pytest.approx([h.score for h in hyps], abs=1e-5)
    assert search.state is None and len(search) == 0  # everything left: the next sentence starts afresh


def test_join_offsets_positions_and_the_self_attention_mask():
    def fresh(n: int, src_len: int) -> DecoderState:
        pad = torch.zeros(n, src_len, dtype=torch.bool)
        pad[0, src_len - 1] = True
        kv = [torch.randn(n, 2, src_len, 4)]
        bias = torch.zeros(n, 1, 1, src_len).masked_fill_(pad[:, None, None, :], torch.finfo(torch.float32).min)
        return DecoderState(kv, [t.clone() for t in kv], pad, bias, None, KVCache(1, n))

    state = fresh(2, 3)
    for t in range(3):  # two sentences, three positions written
        state.self_kv.append(0, t, torch.ones(2, 2, 2, 4))
        state.step += 1
    state.join(fresh(1, 5))  # one more, with a longer source, starting at position 3
    assert state.offset.tolist() == [0, 0, 3] and state.src_pad.shape == (3, 5)
    assert bool(state.src_pad[:2, 3:].all()) and state.src_pad[2].tolist() == [False] * 4 + [True]  # common length
    assert state.cross_k[0].shape == (3, 2, 5, 4) and bool((state.cross_k[0][:2, :, 3:] == 0).all())
    assert state.positions().tolist() == [3, 3, 0]
    bias = state.self_bias()[:, 0, 0]  # (R, step+1)
    assert bool((bias[:2] == 0).all()) and bool((bias[2, :3] < -1e30).all()) and bias[2, 3] == 0
    k, _ = state.self_kv.views(3)
    assert bool((k[0][2] == 0).all()) and bool((k[0][:2] == 1).all())  # the new row's masked positions: zeros
    state.reorder(torch.tensor([2]), sentences=torch.tensor([2]))  # only the newcomer is left:
    assert state.offset.tolist() == [0] and state.step == 0  # the positions before it are cut away
    assert state.self_bias() is None and state.positions().tolist() == [0]


def test_cache_select_from_a_first_position():
    cache = KVCache(1, 2)
    for t in range(4):
        cache.append(0, t, torch.full((2, 2, 1, 1), float(t)))
    cache.select(torch.tensor([1, 0]), 4, first=2)
    k, v = cache.views(2)
    assert k[0][:, 0, :, 0].tolist() == [[2.0, 3.0], [2.0, 3.0]] and v[0].shape == (2, 1, 2, 1)
