"""Transformer: causality, padding invariance, incremental decoding, NaN safety, sizes, variants."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from nmt import PAD_ID
from nmt.config import ModelConfig, config_from_dict, load_config
from nmt.errors import ConfigError, NmtError
from nmt.model.attention import resolve_backend
from nmt.model.kv_cache import INITIAL_ROOM
from nmt.model.transformer import Transformer, analytic_parameter_count, build_model, model_summary

ROOT = Path(__file__).resolve().parents[2]
SRC_V, TGT_V = 50, 60
BACKENDS = ["math", "sdpa"]


def small_cfg(**overrides) -> ModelConfig:
    base = dict(d_model=32, heads=4, encoder_layers=2, decoder_layers=2, ffn_dim=64, dropout=0.0, max_positions=64)
    return ModelConfig(**{**base, **overrides})


def make_model(backend: str = "sdpa", **overrides) -> Transformer:
    return Transformer(small_cfg(attention=backend, **overrides), SRC_V, TGT_V).eval()


def batch(B: int = 4, S: int = 7, T: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Random src (B, S) and tgt_in (B, T) with right padding; row 0 is full length."""
    src = torch.randint(4, SRC_V, (B, S))
    tgt = torch.randint(4, TGT_V, (B, T))
    for i in range(1, B):
        src[i, torch.randint(1, S + 1, ()).item() :] = PAD_ID
        tgt[i, torch.randint(1, T + 1, ()).item() :] = PAD_ID
    return src, tgt


# --------------------------------------------------------------------------- behaviour


@pytest.mark.parametrize("backend", BACKENDS)
def test_causality(backend):
    model = make_model(backend)
    src, tgt = batch(B=2, T=8)
    tgt[:, :] = torch.randint(4, TGT_V, tgt.shape)  # no padding
    t = 3
    changed = tgt.clone()
    changed[:, t + 1 :] = torch.randint(4, TGT_V, changed[:, t + 1 :].shape)
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])  # the change did reach later positions


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_invariance(backend):
    model = make_model(backend)
    src, tgt = batch()
    with torch.no_grad():
        logits = model(src, tgt)  # (B, T, V)
        enc = model.encode(src)
        wider = model(torch.nn.functional.pad(src, (0, 3)), torch.nn.functional.pad(tgt, (0, 2)))
        real_t, real_s = tgt != PAD_ID, src != PAD_ID
        torch.testing.assert_close(wider[:, : tgt.size(1)][real_t], logits[real_t], atol=1e-5, rtol=1e-5)
        for i in range(src.size(0)):  # each sentence alone, unpadded
            s_i, t_i = src[i : i + 1, : int(real_s[i].sum())], tgt[i : i + 1, : int(real_t[i].sum())]
            alone_enc = model.encode(s_i).memory[0]
            torch.testing.assert_close(alone_enc, enc.memory[i, : s_i.size(1)], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(model(s_i, t_i)[0], logits[i, : t_i.size(1)], atol=1e-5, rtol=1e-5)


def test_encode_by_length_runs_length_groups_and_equals_encode(monkeypatch):
    model = make_model()
    lengths = [2, 20, 3, 18, 19, 4, 2, 17, 3, 21]
    src = torch.full((len(lengths), max(lengths)), PAD_ID)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, SRC_V, (n,))
    with torch.no_grad():
        whole = model.encode(src)
        calls: list[int] = []
        plain = model.encode
        monkeypatch.setattr(model, "encode", lambda s: calls.append(s.size(1)) or plain(s))
        grouped = model.encode_by_length(src)
    assert sorted(calls) == [4, 21]  # two groups, each as wide as its longest source
    assert torch.equal(grouped.src_pad, whole.src_pad)
    real = ~whole.src_pad
    torch.testing.assert_close(grouped.memory[real], whole.memory[real], atol=1e-5, rtol=1e-5)


def step_logits(model: Transformer, src: torch.Tensor, tgt: torch.Tensor, reorder_at: int, index: torch.Tensor):
    """Feed tgt (B, T) one token at a time; after `reorder_at` steps reorder the cache with `index`
    and continue with tgt[index]. Returns the step logits (B', T, V) of the final row order."""
    state = model.start_decoding(model.encode(src))
    out, rows = [], torch.arange(src.size(0))
    for t in range(tgt.size(1)):
        if t == reorder_at:
            state.reorder(index)
            rows = rows[index]
            out = [o[index] for o in out]
        out.append(model.decode_step(tgt[rows, t], state))
    return torch.stack(out, dim=1), rows


@pytest.mark.parametrize("backend", BACKENDS)
def test_incremental_decoding_matches_teacher_forcing(backend):
    model = make_model(backend)
    src, tgt = batch(B=3, T=7)
    with torch.no_grad():
        full = model(src, tgt)  # (B, T, V)
        for reorder_at, index in [(99, torch.arange(3)), (3, torch.tensor([2, 0, 0, 1, 2]))]:
            steps, rows = step_logits(model, src, tgt, reorder_at, index)
            assert steps.dtype == torch.float32 and steps.shape == (len(rows), 7, TGT_V)
            real = tgt[rows] != PAD_ID
            torch.testing.assert_close(steps[real], full[rows][real], atol=1e-5, rtol=1e-5)


def test_reorder_can_drop_rows_and_advances_positions():
    model = make_model()
    src, _ = batch(B=3)
    state = model.start_decoding(model.encode(src))
    model.decode_step(torch.full((3,), 2), state)
    state.reorder(torch.tensor([2]))
    assert state.batch_size == 1 and state.step == 1
    assert all(k.size(0) == 1 for k in state.self_k + state.cross_k)
    assert state.self_k[0].size(2) == 1  # one cached position per layer


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_nan_with_fully_padded_rows(backend):
    model = make_model(backend, dropout=0.1).train()
    src, tgt = batch(B=3)
    src[1] = PAD_ID  # a source row with no tokens at all
    tgt[2] = PAD_ID
    logits = model(src, tgt)
    logits.float().sum().backward()
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad():
        state = model.start_decoding(model.encode(src))
        assert torch.isfinite(model.decode_step(tgt[:, 0], state)).all()


def test_decode_step_returns_fp32_under_autocast():
    model = make_model()
    src, tgt = batch(B=2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        state = model.start_decoding(model.encode(src))
        logits = model.decode_step(tgt[:, 0], state)
        logits2 = model.decode_step(tgt[:, 1], state)
    assert logits.dtype == torch.float32 and logits2.shape == (2, TGT_V)


def test_positions_beyond_max_positions_raise():
    model = make_model(max_positions=8)
    with pytest.raises(NmtError, match="max_positions"):
        model(torch.randint(4, SRC_V, (1, 9)), torch.randint(4, TGT_V, (1, 3)))


# --------------------------------------------------------------------------- variants, init


@pytest.mark.parametrize(
    "overrides",
    [
        dict(norm="pre"),
        dict(norm="post"),
        dict(tie_embeddings=False),
        dict(positions="learned"),
        dict(norm="post", tie_embeddings=False, positions="learned", activation="gelu"),
    ],
)
def test_variants_build_train_and_decode(overrides):
    model = make_model("sdpa", **overrides)
    src, tgt = batch(B=2, T=5)
    model.train()
    model(src, tgt).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        steps, rows = step_logits(model, src, tgt, 99, torch.arange(2))
        real = tgt != PAD_ID
        torch.testing.assert_close(steps[real], model(src, tgt)[real], atol=1e-5, rtol=1e-5)
    params = sum(p.numel() for p in model.parameters())
    assert params == analytic_parameter_count(model.cfg, SRC_V, TGT_V)


def test_initialisation():
    model = Transformer(small_cfg(d_model=64, ffn_dim=128), 3000, 3000)
    std = 64**-0.5
    for emb in (model.src_embed.weight, model.tgt_embed.weight):
        assert torch.equal(emb[PAD_ID], torch.zeros(64))
        assert abs(emb[1:].std().item() - std) < 0.1 * std
    layer = model.encoder.layers[0]
    bound = (6 / (64 + 64)) ** 0.5  # Xavier-uniform of each D×D slice of the fused projection
    assert layer.self_attn.in_proj.weight.abs().max() <= bound
    assert layer.self_attn.in_proj.weight.abs().max() > 0.9 * bound
    assert torch.equal(layer.self_attn.in_proj.bias, torch.zeros(3 * 64))
    assert layer.ffn.fc1.weight.abs().max() <= (6 / (64 + 128)) ** 0.5
    storages = {p.data_ptr() for p in model.parameters()}
    assert len(storages) == len(list(model.parameters()))  # every layer has its own parameters


def test_packed_logits_are_the_real_rows_of_the_full_logits():
    model = make_model()
    src, tgt = batch(B=5)
    keep = tgt != PAD_ID
    assert not keep.all()
    with torch.no_grad():
        full, packed = model(src, tgt), model(src, tgt, keep)
    assert packed.shape == (int(keep.sum()), TGT_V)
    torch.testing.assert_close(packed, full[keep])


@pytest.mark.parametrize("tie", [True, False])
def test_unprojected_output_times_output_weight_is_the_packed_logits(tie):
    model = make_model(tie_embeddings=tie)
    src, tgt = batch(B=5)
    keep = tgt != PAD_ID
    with torch.no_grad():
        packed, h = model(src, tgt, keep), model(src, tgt, keep, project=False)
    assert h.shape == (int(keep.sum()), 32)
    assert model.output_weight is (model.tgt_embed.weight if tie else model.output_proj.weight)
    torch.testing.assert_close(h @ model.output_weight.T, packed)


def test_tied_output_projection_is_the_decoder_embedding():
    model = make_model()
    assert model.output_proj is None
    h = torch.randn(1, 1, 32)
    torch.testing.assert_close(model._logits(h), h @ model.tgt_embed.weight.T)
    names = list(model.state_dict())
    assert "tgt_embed.weight" in names and not any(n.startswith("output_proj") for n in names)


# --------------------------------------------------------------------------- sizes, summary, build


def test_parameter_count_tiny_is_exact(tiny_config):
    model = build_model(tiny_config, 400, 400)
    assert sum(p.numel() for p in model.parameters()) == analytic_parameter_count(tiny_config.model, 400, 400)


def test_parameter_count_base_with_32k_vocabs():
    cfg = load_config(ROOT / "configs" / "base.yaml")
    with torch.device("meta"):  # shapes only, no memory or init cost
        model = build_model(cfg, 32000, 32000)
    real = sum(p.numel() for p in model.parameters())
    analytic = analytic_parameter_count(cfg.model, 32000, 32000)
    assert abs(real - analytic) <= 0.05 * analytic
    assert real == analytic
    assert 70e6 < real < 80e6  # 6+6 × d512 layers (44.1M) + two 32k × 512 embeddings (32.8M)
    summary = model_summary(model)
    assert "6+6 layers" in summary and f"{real / 1e6:.2f}M parameters" in summary


def test_model_summary_names_backend():
    text = model_summary(make_model("math"))
    assert "attention backend: math" in text
    model = make_model("auto")
    head_dim = model.cfg.d_model // model.cfg.heads
    measured = resolve_backend("auto", torch.device("cpu"), torch.float32, head_dim=head_dim)
    text = model_summary(model)  # on a CPU, auto names the backend its timed probe chose
    assert f"attention backend: {measured}" in text and "2+2 layers" in text and "d_model 32" in text
    assert "encoder" in text and "decoder" in text and "embeddings" in text


def test_flash_config_loads_and_builds_without_cuda_and_fails_only_when_run(monkeypatch, tiny_config):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert config_from_dict({"model": {"attention": "flash"}}).model.attention == "flash"  # no host check at load
    flash_cfg = dataclasses.replace(tiny_config, model=dataclasses.replace(tiny_config.model, attention="flash"))
    model = build_model(flash_cfg, 400, 400)
    src, tgt = torch.randint(4, 400, (1, 4)), torch.randint(4, 400, (1, 3))
    with pytest.raises(ConfigError, match="model.attention"):
        model(src, tgt)


def test_a_run_trained_with_flash_loads_decodes_and_averages_on_cpu(tmp_path, monkeypatch, tiny_config):
    """Train on a GPU (a checkpoint whose stored config says flash), decode and average on a CPU."""
    from nmt.batches.batching import pad_sources
    from nmt.decode.engines import NativeEngine
    from nmt.run import weights as ckpt

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    flash_cfg = dataclasses.replace(tiny_config, model=dataclasses.replace(tiny_config.model, attention="flash"))
    trained = build_model(flash_cfg, 60, 60)
    paths = [ckpt.save_checkpoint(tmp_path, step, trained, {}, flash_cfg, keep_last=5) for step in (1, 2)]
    averaged = ckpt.average_checkpoints(paths, tmp_path / "averaged.safetensors")
    for path in [*paths, averaged]:
        state, stored = ckpt.load_weights(path)
        assert stored.model.attention == "flash"
        stored.model.attention = "auto"  # what Translator.from_run does off CUDA
        model = build_model(stored, 60, 60)
        model.load_state_dict(state)
        engine = NativeEngine(model, stored.decode, torch.device("cpu"), "fp32")
        found = engine.search([[5, 6, 7], [8]], beam=2, nbest=1, len_penalty=1.0, greedy=False)
        assert len(found) == 2 and all(len(row) == 1 for row in found)
    assert pad_sources([[5]]).shape == (1, 2)


@pytest.mark.cuda
def test_flash_model_matches_math_on_cuda():
    model = make_model("math").cuda()
    src, tgt = (t.cuda() for t in batch(B=6, S=30, T=25))
    with torch.no_grad():
        ref = model(src, tgt)
        for m in model.modules():
            if hasattr(m, "backend"):
                m.backend = "flash"
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(src, tgt).float()
    real = tgt != PAD_ID
    torch.testing.assert_close(out[real], ref[real], atol=5e-2, rtol=5e-2)


def test_beam_rows_share_their_sentence_and_match_one_row_per_sentence():
    """A state with two beams per sentence (cross K/V once per sentence) gives the logits of a
    state that repeats every sentence per row, through expansion, beam moves and a drop."""
    model = make_model()
    src, tgt = batch(B=2)
    index = torch.tensor([0, 0, 1, 1])
    with torch.no_grad():
        rows, beams = (model.start_decoding(model.encode(src)) for _ in range(2))
        for state in (rows, beams):
            model.decode_step(tgt[:, 0], state)
        rows.reorder(index)  # one row per "sentence": the source side is repeated too
        beams.reorder(index, beam=2)  # two beams per sentence: the source side stays
        assert beams.cross_k[0].size(0) == 2 and rows.cross_k[0].size(0) == 4 and beams.batch_size == 4
        a, b = (model.decode_step(tgt[index, 1], s) for s in (rows, beams))
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        cross = beams.cross_k[0]
        rows.reorder(torch.tensor([1, 0, 3, 3]))
        beams.reorder(torch.tensor([1, 0, 3, 3]))  # beams move within their sentence
        assert beams.cross_k[0] is cross
        a, b = (model.decode_step(tgt[index, 2], s) for s in (rows, beams))
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        rows.reorder(torch.tensor([3, 2]))
        beams.reorder(torch.tensor([3, 2]), sentences=torch.tensor([1]))  # sentence 0 is done
        a, b = (model.decode_step(tgt[[1, 1], 3], s) for s in (rows, beams))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert beams.batch_size == 2 and beams.cross_k[0].size(0) == 1


def test_cache_grows_and_keeps_what_was_written():
    """Past the initial room the cache moves to a bigger buffer; decoding still matches teacher forcing."""
    model = make_model(max_positions=64)
    src, _ = batch(B=2)
    tgt = torch.randint(4, TGT_V, (2, INITIAL_ROOM + 5))
    with torch.no_grad():
        full = model(src, tgt)
        state = model.start_decoding(model.encode(src))
        steps = torch.stack([model.decode_step(tgt[:, t], state) for t in range(tgt.size(1))], dim=1)
    assert state.self_kv.kv.size(4) > INITIAL_ROOM
    torch.testing.assert_close(steps, full, atol=1e-4, rtol=1e-4)


def test_split_projections_keeps_outputs_and_exposes_linear_layers():
    model = make_model().eval()
    src, tgt = batch(B=3)
    with torch.no_grad():
        full = model(src, tgt)
        state = model.start_decoding(model.encode(src))
        step = model.decode_step(tgt[:, 0], state)
        model.split_projections()
        torch.testing.assert_close(model(src, tgt), full, atol=1e-6, rtol=1e-6)
        state = model.start_decoding(model.encode(src))
        torch.testing.assert_close(model.decode_step(tgt[:, 0], state), step, atol=1e-6, rtol=1e-6)
    from nmt.model.convert import quantize_int8

    quantised = quantize_int8(model)
    assert not any(type(m) is torch.nn.Linear for m in quantised.modules())
    with torch.no_grad():
        state = quantised.start_decoding(quantised.encode(src))
        assert torch.isfinite(quantised.decode_step(tgt[:, 0], state)).all()


def test_a_model_built_to_be_loaded_skips_its_random_initialisation(monkeypatch):
    """`without_initialisation`: torch.nn.init's fills do nothing inside (the checkpoint overwrites
    every parameter), and everything is restored after, even when the build raises."""
    from nmt.model.transformer import INIT_FUNCTIONS, without_initialisation

    calls = []
    monkeypatch.setattr(torch.nn.init, "xavier_uniform_", lambda t, *a, **k: calls.append(t.shape) or t)
    cfg = ModelConfig(d_model=16, heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=32)
    Transformer(cfg, 20, 20)
    assert calls  # built normally: initialised
    calls.clear()
    patched = torch.nn.init.xavier_uniform_
    with without_initialisation():
        model = Transformer(cfg, 20, 20)
    assert not calls and torch.nn.init.xavier_uniform_ is patched
    reference = Transformer(cfg, 20, 20).state_dict()
    model.load_state_dict(reference)  # strict: every parameter comes from the checkpoint
    assert all(torch.equal(model.state_dict()[k], v) for k, v in reference.items())
    before = {name: getattr(torch.nn.init, name) for name in INIT_FUNCTIONS}
    with pytest.raises(RuntimeError), without_initialisation():
        raise RuntimeError("a build that fails")
    assert {name: getattr(torch.nn.init, name) for name in INIT_FUNCTIONS} == before
