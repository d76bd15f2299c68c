"""The bf16 weight copy a CPU trains in (`nmt.train.weight_copy`) and the trainer's use of it: bf16
copies that follow the fp32 master, gradients gathered in fp32, the choice between the copy and
autocast, and an update that matches autocast's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import record_step_grads

from nmt.batches.batching import Batch, collate
from nmt.config import ModelConfig, TrainConfig
from nmt.model.shared_rows import share_rows
from nmt.model.transformer import Transformer
from nmt.train.update import StepResult, Trainer, uses_weight_copy
from nmt.train.weight_copy import WeightCopy

CPU = torch.device("cpu")


def constant_lr(**extra) -> TrainConfig:
    """A flat learning rate of 0.01 from the first update, fp32 unless `extra` says otherwise."""
    cfg = dict(precision="fp32", schedule="cosine", lr=0.01, min_lr=0.01, warmup=1, max_steps=1000)
    return TrainConfig(**{**cfg, **extra})


def batches(seed: int, n: int) -> list[Batch]:
    """Two micro-batches of n / 2 random pairs each."""
    rng = np.random.default_rng(seed)
    pairs = [(rng.integers(4, 30, rng.integers(1, 7)).tolist(), rng.integers(4, 30, rng.integers(1, 7)).tolist())
             for _ in range(n)]  # fmt: skip
    return [collate(pairs[: n // 2]), collate(pairs[n // 2 :])]


def one_update(trainer: Trainer, micro: list[Batch]) -> StepResult:
    trainer.update(micro)
    [result] = trainer.sync()
    return result


def tiny_transformer(seed: int = 0) -> Transformer:
    cfg = ModelConfig(d_model=16, heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=32, max_positions=64,
                      dropout=0.0, attention="math")  # fmt: skip
    torch.manual_seed(seed)
    return Transformer(cfg, 30, 30)


def test_the_copy_is_bf16_ties_its_own_weights_and_leaves_the_master_alone():
    master = tiny_transformer()
    before = {k: v.clone() for k, v in master.state_dict().items()}
    low = WeightCopy(master).model
    assert all(p.dtype == torch.bfloat16 for p in low.parameters())
    assert all(p.dtype == torch.float32 for p in master.parameters())
    assert low.output_weight is low.tgt_embed.weight  # tied in the copy as in the master
    assert low.output_weight is not master.output_weight
    for key, value in low.state_dict().items():
        assert torch.equal(value, before[key].to(value.dtype)), key
        assert torch.equal(master.state_dict()[key], before[key])


def test_refresh_follows_the_master_and_its_mode():
    master = tiny_transformer()
    copy = WeightCopy(master)
    with torch.no_grad():
        for p in master.parameters():
            p.add_(1.0)
    master.eval()
    copy.refresh()
    for (key, value), mine in zip(master.state_dict().items(), copy.model.state_dict().values(), strict=True):
        assert torch.equal(mine, value.to(mine.dtype)), key
    assert not copy.model.training
    master.train()
    copy.refresh()
    assert copy.model.training


def test_collect_adds_the_copys_gradients_into_the_master_in_fp32():
    """Two micro-batches: the master's .grad is the fp32 sum of the copy's two gradients."""
    master = tiny_transformer()
    copy = WeightCopy(master)
    seen: list[dict[str, torch.Tensor]] = []
    for seed in (1, 2):
        src, tgt = (torch.randint(4, 30, (3, 5), generator=torch.Generator().manual_seed(seed)) for _ in range(2))
        copy.model(src, tgt).float().square().mean().backward()
        seen.append({n: p.grad.clone() for n, p in copy.model.named_parameters()})
        copy.collect()
        assert all(p.grad is None for p in copy.model.parameters())
    for name, p in master.named_parameters():
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, seen[0][name].float() + seen[1][name].float(), rtol=0, atol=0)


def test_the_trainer_uses_the_copy_for_bf16_on_a_cpu_only():
    model = tiny_transformer()
    on = constant_lr(precision="bf16")
    assert uses_weight_copy(model, on, CPU, "bf16")
    assert not uses_weight_copy(model, constant_lr(precision="bf16", bf16_weight_copy=False), CPU, "bf16")
    assert not uses_weight_copy(model, constant_lr(), CPU, "fp32")
    assert not uses_weight_copy(model, on, torch.device("meta"), "bf16")  # stands for CUDA: autocast
    assert not uses_weight_copy(torch.compile(model), on, CPU, "bf16")  # a wrapped model keeps autocast
    trainer = Trainer(model, on, CPU, precision="bf16")
    assert trainer.copy is not None and trainer.forward_model is trainer.copy.model
    assert Trainer(tiny_transformer(), constant_lr(), CPU, precision="fp32").copy is None


def test_an_update_on_the_copy_matches_autocast_and_steps_the_fp32_master():
    """The same weights and batches: the loss and the gradients the optimizer gets from the bf16
    copy agree with bf16 autocast over fp32 weights to bf16's precision; the master stays fp32
    and is stepped."""
    a, b = tiny_transformer(), tiny_transformer()
    start = {k: v.clone() for k, v in a.state_dict().items()}
    copied = Trainer(a, constant_lr(precision="bf16"), CPU, precision="bf16")
    autocast = Trainer(b, constant_lr(precision="bf16", bf16_weight_copy=False), CPU, precision="bf16")
    assert copied.copy is not None and autocast.copy is None
    grads = {"copy": record_step_grads(copied), "autocast": record_step_grads(autocast)}
    for seed in (1, 2):
        ra, rb = one_update(copied, batches(seed, 8)), one_update(autocast, batches(seed, 8))
        assert ra.loss == pytest.approx(rb.loss, rel=2e-2) and ra.grad_norm == pytest.approx(rb.grad_norm, rel=5e-2)
    assert len(grads["copy"]) == len(grads["autocast"]) == 2 * len(copied.params)
    for ga, gb in zip(grads["copy"], grads["autocast"], strict=True):
        assert ga.dtype == torch.float32
        assert torch.cosine_similarity(ga.flatten(), gb.flatten(), dim=0) > 0.95  # same direction, tensor by tensor
    whole = [torch.cat([g.flatten() for g in grads[name]]) for name in ("copy", "autocast")]
    assert (whole[0] - whole[1]).norm() <= 0.05 * whole[1].norm()  # bf16 activations: 8 significant bits
    assert all(p.dtype == torch.float32 for p in a.parameters())
    assert sum(not torch.equal(w, start[k]) for k, w in a.state_dict().items()) >= len(start) - 2


def test_shared_rows_stay_whole_in_the_master_and_the_copy_reads_them():
    """With `share_piece_embeddings`'s sync after each step, the master's shared source rows equal
    the target rows they read, and the next update's copy holds them too."""
    model = tiny_transformer()
    shared = share_rows(model, torch.tensor([[5, 7], [6, 8]]))
    trainer = Trainer(model, constant_lr(precision="bf16"), CPU, precision="bf16")
    trainer.optimizer.register_step_post_hook(lambda *_: shared.sync())
    for seed in (1, 2):
        one_update(trainer, batches(seed, 8))
    src, tgt = model.src_embed.weight, model.tgt_embed.weight
    assert torch.equal(src[[5, 6]], tgt[[7, 8]]) and not torch.equal(src[[9]], tgt[[9]])
    trainer.copy.refresh()
    low = trainer.copy.model
    assert torch.equal(low.src_embed.table()[[5, 6]], low.tgt_embed.weight[[7, 8]])
    assert torch.equal(low.src_embed.weight, src.to(torch.bfloat16))
