"""`Trainer.update` reads nothing back from the device; `Trainer.sync` reads back once (nmt/train/update.py).
And what an update does: non-finite losses skipped and counted, accumulation, clipping."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import record_step_grads
from torch import nn

from nmt.batches.batching import Batch, collate
from nmt.config import TrainConfig, load_config
from nmt.errors import NmtError
from nmt.train.update import StepResult, Trainer, host_counts

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")


class PackedToy(nn.Module):
    """Embedding + linear that packs logits (`PacksLogits`) and takes the host packing, picking the
    real target positions by its index: a model whose forward never reads the device back."""

    packs_logits = True

    def __init__(self, vocab: int = 30) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.out = nn.Linear(8, vocab)
        self.poison = False

    def forward(self, src, tgt_in, keep=None, packing=None):
        h = self.emb(tgt_in) + self.emb(src).mean(dim=1, keepdim=True)  # (B, T, D)
        if keep is not None:
            h = h[keep] if packing is None else h.flatten(0, 1)[packing[1].index]  # (N, D)
        logits = self.out(h)
        return logits * float("nan") if self.poison else logits


def batches(seed: int, n: int = 4) -> list[Batch]:
    rng = np.random.default_rng(seed)
    pairs = [(rng.integers(4, 30, rng.integers(1, 7)).tolist(), rng.integers(4, 30, rng.integers(1, 7)).tolist())
             for _ in range(n)]  # fmt: skip
    return [collate(pairs[: n // 2]), collate(pairs[n // 2 :])]


def one_update(trainer: Trainer, batches: list) -> StepResult:
    """Issue one update and read it back."""
    trainer.update(batches)
    [result] = trainer.sync()
    return result


def constant_lr(**extra) -> TrainConfig:
    """A schedule flat at lr from the first update (cosine from lr to lr), fp32."""
    cfg = dict(precision="fp32", schedule="cosine", lr=0.01, min_lr=0.01, warmup=1, max_steps=1000)
    return TrainConfig(**{**cfg, **extra})


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """Every host read of a tensor's value (what waits for a GPU), by method name."""
    seen: list[str] = []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            seen.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return seen


def test_updates_read_nothing_back_until_sync(reads):
    torch.manual_seed(0)
    trainer = Trainer(PackedToy(), constant_lr(max_nonfinite=100), torch.device("cpu"), precision="fp32")
    for seed in range(5):
        trainer.update(batches(seed))
    assert reads == []  # loss, NLL, tokens, grad norm and the skip decision all stayed on the device
    assert trainer.state.step == 5
    results = trainer.sync()
    assert reads == ["tolist"]  # one read-back for the five updates
    assert [r.step for r in results] == [1, 2, 3, 4, 5] and not any(r.skipped for r in results)
    expected = [sum(b.tgt_packing.index.numel() for b in batches(seed)) for seed in range(5)]
    assert [r.tokens for r in results] == expected and trainer.state.tokens == sum(expected)
    assert all(np.isfinite(r.loss) and r.grad_norm > 0 for r in results)


def test_sync_hands_out_every_update_read_back_since_the_last_sync(reads):
    """Those a checkpoint read back included; results are plain numbers, read once."""
    trainer = Trainer(PackedToy(), constant_lr(max_nonfinite=100), torch.device("cpu"), precision="fp32")
    trainer.update(batches(1))
    trainer.state_dict()  # reads the first back
    trainer.update(batches(2))
    first, second = trainer.sync()
    assert reads.count("tolist") == 2 and (first.step, second.step) == (1, 2)
    assert isinstance(second.loss, float) and isinstance(second.tokens, int) and trainer.sync() == []
    assert reads.count("tolist") == 2  # nothing issued: no read-back


def test_a_nonfinite_update_is_skipped_on_the_device_and_taken_back_at_flush():
    """clean, NaN, clean without a read in between = clean, clean: same weights and optimizer state."""
    torch.manual_seed(0)
    a, b = PackedToy(), PackedToy()
    b.load_state_dict(a.state_dict())
    ta = Trainer(a, constant_lr(), torch.device("cpu"), precision="fp32")
    tb = Trainer(b, constant_lr(), torch.device("cpu"), precision="fp32")
    ta.update(batches(1))
    a.poison = True
    ta.update(batches(2))
    a.poison = False
    ta.update(batches(3))
    assert ta.state.step == 3  # provisional until the read-back
    results = ta.sync()
    assert [(r.step, r.skipped) for r in results] == [(1, False), (2, True), (2, False)]
    assert (ta.state.step, ta.state.nonfinite_total, ta.state.nonfinite_run) == (2, 1, 0)
    tb.update(batches(1))
    tb.update(batches(3))
    tb.sync()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        sa, sb = ta.optimizer.state[pa], tb.optimizer.state[pb]
        assert all(torch.equal(sa[k], sb[k]) for k in ("step", "exp_avg", "exp_avg_sq")), name


def test_the_batch_packing_gives_the_same_update_as_the_pad_mask():
    """The target gathered at the host-computed index = the target selected by the pad mask."""
    torch.manual_seed(0)
    a, b = PackedToy(), PackedToy()
    b.load_state_dict(a.state_dict())
    ra = one_update(Trainer(a, constant_lr(), torch.device("cpu"), precision="fp32"), batches(4))
    rb = one_update(
        Trainer(b, constant_lr(), torch.device("cpu"), precision="fp32"), [tuple(x) for x in batches(4)]
    )  # no packing
    assert (ra.loss, ra.nll, ra.tokens, ra.grad_norm) == (rb.loss, rb.nll, rb.tokens, rb.grad_norm)
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))


def test_host_counts_of_a_batch_match_its_tensors():
    for batch in batches(5, n=6):
        src, _, tgt_out = batch
        assert host_counts(batch) == host_counts((src, batch.tgt_in, tgt_out))
        tokens, pad, slots = host_counts(batch)
        assert tokens == int((tgt_out != 0).sum()) and slots == src.numel() + tgt_out.numel()
        assert pad == int((src == 0).sum() + (tgt_out == 0).sum())


def test_a_checkpoint_settles_first():
    trainer = Trainer(PackedToy(), constant_lr(max_nonfinite=100), torch.device("cpu"), precision="fp32")
    trainer.update(batches(6))
    state = trainer.state_dict()
    assert state["train"]["step"] == 1 and state["train"]["tokens"] == trainer.sync()[0].tokens


class Toy(nn.Module):
    """Embedding + linear that does not pack its logits (the pad-mask path); NaN logits while `poison` is set."""

    def __init__(self, vocab: int = 12) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 8)
        self.out = nn.Linear(8, vocab)
        self.poison = False

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        h = self.emb(tgt_in) + self.emb(src).mean(dim=1, keepdim=True)
        logits = self.out(h)
        return logits * float("nan") if self.poison else logits


def toy_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    src = torch.tensor([[5, 6, 3], [7, 3, 0]])
    tgt_in = torch.tensor([[2, 8, 9], [2, 10, 0]])
    tgt_out = torch.tensor([[8, 9, 3], [10, 3, 0]])
    return src, tgt_in, tgt_out


def test_nonfinite_loss_is_skipped_counted_and_aborts():
    cfg = load_config(TINY, ["train.max_nonfinite=3"]).train
    model = Toy()
    trainer = Trainer(model, cfg, torch.device("cpu"), precision="fp32")
    assert not one_update(trainer, [toy_batch()]).skipped
    assert trainer.state.step == 1
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.poison = True
    for i in (1, 2):
        r = one_update(trainer, [toy_batch()])
        assert r.skipped and trainer.state.nonfinite_run == i
    assert trainer.state.step == 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # no update applied
    model.poison = False
    assert not one_update(trainer, [toy_batch()]).skipped
    assert trainer.state.nonfinite_run == 0 and trainer.state.nonfinite_total == 2
    model.poison = True
    trainer.update([toy_batch()])
    trainer.update([toy_batch()])
    with pytest.raises(NmtError, match="3 non-finite losses in a row"):
        trainer.update([toy_batch()])


def test_accumulation_equals_one_big_batch():
    """update_freq micro-batches = one batch holding them all (loss normalised per token)."""
    cfg = load_config(TINY, ["train.label_smoothing=0.1", "train.clip_norm=0"]).train
    torch.manual_seed(3)
    a = Toy()
    b = Toy()
    b.load_state_dict(a.state_dict())
    src, tgt_in, tgt_out = toy_batch()
    ra = one_update(
        Trainer(a, cfg, torch.device("cpu"), precision="fp32"),
        [(src[:1], tgt_in[:1], tgt_out[:1]), (src[1:], tgt_in[1:], tgt_out[1:])],
    )
    rb = one_update(Trainer(b, cfg, torch.device("cpu"), precision="fp32"), [(src, tgt_in, tgt_out)])
    assert ra.tokens == rb.tokens == 5
    assert ra.loss == pytest.approx(rb.loss, rel=1e-6)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, msg=name)


def test_clipping_bounds_the_update():
    cfg = load_config(TINY, ["train.clip_norm=0.001", "train.lr=1.0", "train.warmup=1"]).train
    trainer = Trainer(Toy(), cfg, torch.device("cpu"), precision="fp32")
    r = one_update(trainer, [toy_batch()])
    assert r.grad_norm > 0.001  # the reported norm is the one before clipping
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1.0)


def test_bf16_on_a_cpu_pads_the_linear_layers_rows_to_a_bucket(monkeypatch):
    """The trainer runs the forward inside `row_buckets` where `matmul_row_bucket` asks for it:
    bf16 on a CPU (oneDNN makes a kernel per matmul shape), not fp32 nor under torch.compile."""
    seen: list[int] = []
    monkeypatch.setattr("nmt.train.update.row_buckets", lambda rows: seen.append(rows) or contextlib.nullcontext())
    cpu = torch.device("cpu")
    for precision, compiled in (("bf16", False), ("fp32", False), ("bf16", True)):
        cfg = constant_lr(precision=precision, max_tokens=2048, compile=compiled)
        one_update(Trainer(PackedToy(), cfg, cpu, precision=precision), batches(5))
    assert seen == [256, 256, 0, 0, 0, 0]  # two micro-batches per update


def test_a_transformer_update_is_the_same_with_the_loss_fused_into_the_projection():
    """`Trainer` projects and computes the loss in chunks for a model that `SplitsProjection`:
    the loss, the NLL and the gradients the step gets are those of the whole-logits path."""
    from nmt.config import ModelConfig
    from nmt.model.transformer import Transformer

    cfg = ModelConfig(d_model=16, heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=32, max_positions=64,
                      dropout=0.0)  # fmt: skip
    torch.manual_seed(0)
    a = Transformer(cfg, 30, 30)
    b = Transformer(cfg, 30, 30)
    b.load_state_dict(a.state_dict())
    ta, tb = (Trainer(m, constant_lr(), torch.device("cpu"), precision="fp32") for m in (a, b))
    tb.splits = False
    assert ta.splits
    grads = {"a": record_step_grads(ta), "b": record_step_grads(tb)}
    ra, rb = one_update(ta, batches(6)), one_update(tb, batches(6))
    assert ra.loss == pytest.approx(rb.loss, rel=1e-6) and ra.nll == pytest.approx(rb.nll, rel=1e-6)
    assert len(grads["a"]) == len(grads["b"]) == len(ta.params)
    for ga, gb in zip(grads["a"], grads["b"], strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-6)


def test_the_fused_loss_is_for_cpus_only():
    """CUDA keeps the whole-logits loss (the fused one was measured on CPUs only)."""
    from nmt.config import ModelConfig
    from nmt.model.transformer import Transformer

    cfg = ModelConfig(d_model=16, heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=32, max_positions=64)
    model = Transformer(cfg, 30, 30)
    assert Trainer(model, constant_lr(), torch.device("cpu"), precision="fp32").splits
    assert not Trainer(model, constant_lr(), torch.device("meta"), precision="fp32").splits  # stands for CUDA
    assert not Trainer(PackedToy(), constant_lr(), torch.device("cpu"), precision="fp32").splits
