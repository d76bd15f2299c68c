"""Guided alignment (nmt/train/alignment.py): the targets read off a batch, the loss of the
supervised head, and the trainer's objective with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nmt.batches.batching import collate
from nmt.batches.copy_spans import spell_spans
from nmt.config import ModelConfig, TrainConfig
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.model.transformer import Transformer
from nmt.serve.attention_map import attention_probs
from nmt.train.alignment import (
    COPY,
    HEAD,
    LEAVE_FROM,
    LEAVE_TO,
    GuidedAlignment,
    alignment_targets,
    copy_keys,
    guided_loss,
)
from nmt.train.update import Trainer

# keys of a made-up pair of vocabularies: ids 10-19 are the digits "0"-"9" on both sides, 20-21 the
# letters "a", "b", 30 a placeholder; the source also holds "a" as a byte piece (40)
SRC_KEYS = np.full(50, -1, dtype=np.int64)
TGT_KEYS = np.full(50, -1, dtype=np.int64)
for _i in (*range(10, 22), 30):
    SRC_KEYS[_i] = TGT_KEYS[_i] = _i
SRC_KEYS[40] = 20
KEYS = (SRC_KEYS, TGT_KEYS, frozenset({20, 21}))


def targets(src: list[int], tgt: list[int]) -> list[int]:
    """The source position each target position copies (-1: none)."""
    return alignment_targets(np.array([src]), np.array([tgt]), KEYS)[0, :, COPY].tolist()


def leaves(src: list[int], tgt: list[int]) -> list[tuple[int, int]]:
    """Per target position, the source run [from, to) it must look away from ((-1, -1): none)."""
    out = alignment_targets(np.array([src]), np.array([tgt]), KEYS)[0]
    return [(int(a), int(b)) for a, b in out[:, [LEAVE_FROM, LEAVE_TO]]]


def test_a_spelled_run_is_aligned_piece_for_piece_with_equal_digits_in_order():
    """ "2005": the two zeros go to the two source zeros in order, not both to the first."""
    src = [5, 6, 12, 10, 10, 15, 7, 3]  # 我 在 2 0 0 5 年 </s>
    tgt = [8, 12, 10, 10, 15, 9, 3]  # ▁In 2 0 0 5 . </s>
    assert targets(src, tgt) == [-1, 2, 3, 4, 5, -1, -1]
    assert leaves(src, tgt) == [(-1, -1)] * 5 + [(2, 6), (-1, -1)]  # "." looks away from "2005"


def test_a_run_that_ends_the_target_has_nothing_to_leave():
    src, tgt = [12, 13, 3, 0], [12, 13, 3, 0]  # "23" </s>: </s> is after the run
    assert leaves(src, tgt) == [(-1, -1), (-1, -1), (0, 2), (-1, -1)]
    assert leaves([12, 13, 3], [12, 13, 0]) == [(-1, -1)] * 3  # padding is not a step


def test_two_spans_go_left_to_right_and_a_byte_piece_matches_its_letter():
    src = [40, 21, 6, 13, 7, 40, 21, 3]  # "ab" (a as a byte) 有 3 个 "ab" </s>
    tgt = [20, 21, 8, 13, 9, 20, 21, 3]
    assert targets(src, tgt) == [0, 1, -1, 3, -1, 5, 6, -1]


def test_a_run_the_source_lacks_a_lone_letter_and_padding_get_none():
    src = [6, 11, 30, 3, 0, 0]  # 1 ⦅0⦆ </s> pad pad
    tgt = [20, 8, 12, 13, 9, 30, 8, 11, 3, 0]  # lone "a", "23" (not in the source), ⦅0⦆, "1", </s>, pad
    assert targets(src, tgt) == [-1, -1, -1, -1, -1, 2, -1, 1, -1, -1]


def test_rows_of_a_batch_are_aligned_each_to_its_own_source():
    src = np.array([[12, 13, 3], [13, 12, 3]])
    tgt = np.array([[12, 13, 3, 0], [8, 12, 13, 3]])
    assert alignment_targets(src, tgt, KEYS)[..., COPY].tolist() == [[0, 1, -1, -1], [-1, -1, -1, -1]]


def test_copy_keys_give_a_byte_piece_and_its_letter_one_key(spm_models):
    src, tgt = Tokenizer(spm_models[0]), Tokenizer(spm_models[1])
    src_keys, tgt_keys, letters = copy_keys(src, tgt)
    byte, letter = src.sp.piece_to_id("<0x75>"), tgt.sp.piece_to_id("u")
    assert src_keys[byte] == tgt_keys[letter] == letter and letter in letters
    assert src_keys[src.sp.piece_to_id("⦅0⦆")] == tgt_keys[tgt.sp.piece_to_id("⦅0⦆")] >= 0
    assert tgt_keys[tgt.sp.piece_to_id("▁the")] == -1 and src_keys[src.sp.piece_to_id(".")] == -1


def test_a_copy_example_is_aligned_on_every_character_of_its_span(spm_models):
    """A copy example as `nmt.batches.copy_spans` makes it (target spelled): every character of the
    made-up span points at the source piece holding that character."""
    src_tok, tgt_tok = Tokenizer(spm_models[0]), Tokenizer(spm_models[1])
    src = src_tok.encode("Kovemi在2005年来了。") + [3]
    tgt = spell_spans(tgt_tok.sp, "Kovemi came in 2005.", ["Kovemi", "2005"]) + [3]
    aligned = alignment_targets(np.array([src]), np.array([tgt]), copy_keys(src_tok, tgt_tok))[0, :, COPY]
    pairs = [(tgt_tok.decode([tgt[t]]), src_tok.decode([src[s]])) for t, s in enumerate(aligned) if s >= 0]
    assert "".join(t for t, _ in pairs) == "Kovemi2005"
    assert all(t == s for t, s in pairs)
    assert [int(s) for s in aligned if s >= 0] == sorted(int(s) for s in aligned if s >= 0)


def small_transformer(seed: int = 0) -> Transformer:
    cfg = ModelConfig(d_model=16, heads=2, encoder_layers=1, decoder_layers=2, ffn_dim=32, max_positions=64,
                      dropout=0.0)  # fmt: skip
    torch.manual_seed(seed)
    return Transformer(cfg, 50, 50)


def test_the_loss_is_minus_the_log_attention_of_the_head_on_the_aligned_pieces():
    """The hook's loss, against the attention maps' own recomputation of the last layer's head:
    −log p on each copied piece, −log(1 − p on the run) after it."""
    model = small_transformer().train()
    batch = collate([([12, 10, 10, 15, 6], [12, 10, 10, 15, 8]), ([5, 6, 7], [8, 9])])
    guide = GuidedAlignment(model, KEYS)
    aligned = guide.targets(*batch)
    guide.expect(aligned, torch.device("cpu"))
    model(batch.src, batch.tgt_in)
    loss = guide.take()

    seen = {}
    layer = model.decoder.layers[-1].cross_attn
    handle = layer.register_forward_hook(lambda m, a, k, o: seen.update(x=a[0], memory=a[1]), with_kwargs=True)
    with torch.no_grad():
        model(batch.src, batch.tgt_in)
    handle.remove()
    probs = attention_probs(layer, seen["x"], seen["memory"], batch.src == 0)[:, HEAD]  # (B, T, S)
    copied = [(b, t, aligned[b, t, COPY]) for b, t in zip(*np.nonzero(aligned[..., COPY] >= 0), strict=True)]
    want = -sum(torch.log(probs[b, t, s]) for b, t, s in copied)
    want -= torch.log(1 - probs[0, 4, 0:4].sum())  # the 8 after "2005" leaves source positions 0-3
    assert len(copied) == 4 and loss.item() == pytest.approx(want.item(), rel=1e-5)


def test_the_loss_is_finite_where_bf16_rounds_the_attention_on_the_run_to_one():
    """A head that stays on the run it has copied: in bf16 its attention there is exactly 1, and
    −log(1 − p) must still be finite (the clamp holds in fp32), with a gradient."""
    scores = torch.tensor([[[0.0, 0.0, 0.0], [30.0, 0.0, 0.0]]], requires_grad=True)  # (R=1, T=2, S=3)
    target = torch.tensor([[[0, -1, -1], [-1, 0, 1]]])  # piece 0 copies source 0; piece 1 leaves it
    log_probs = scores.bfloat16().log_softmax(-1)
    assert log_probs[0, 1, 0].exp().item() == 1.0  # what the clamp at 1 − 1e-6 meets in bf16
    loss = guided_loss(log_probs, target)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss) and torch.isfinite(scores.grad).all()


def test_under_autocast_the_hook_records_a_finite_fp32_loss():
    """With autocast in bf16 (CUDA training, DDP on a CPU, ``train.bf16_weight_copy: false``) the
    head's scores and the loss stay fp32: the same loss as without autocast, to bf16's precision."""
    model = small_transformer().train()
    batch = collate([([12, 10, 10, 15, 6], [12, 10, 10, 15, 8]), ([5, 6, 7], [8, 9])])
    guide = GuidedAlignment(model, KEYS)
    losses = []
    for enabled in (False, True):
        guide.expect(guide.targets(*batch), torch.device("cpu"))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            model(batch.src, batch.tgt_in)
        losses.append(guide.take())
    assert all(loss.dtype == torch.float32 and torch.isfinite(loss) for loss in losses)
    assert losses[1].item() == pytest.approx(losses[0].item(), rel=0.05)


def test_the_hook_records_nothing_unarmed_or_in_evaluation():
    model = small_transformer()
    guide = GuidedAlignment(model, KEYS)
    batch = collate([([12, 13, 6], [12, 13])])
    model.train()(batch.src, batch.tgt_in)
    assert guide.take() is None  # not armed
    guide.expect(guide.targets(*batch), torch.device("cpu"))
    with torch.no_grad():
        model.eval()(batch.src, batch.tgt_in)
    assert guide.take() is None
    guide.expect(guide.targets(*collate([([5, 6], [8, 9])])), torch.device("cpu"))  # nothing copied
    model.train()(batch.src, batch.tgt_in)
    assert guide.take() is None


def train_cfg(weight: float) -> TrainConfig:
    return TrainConfig(precision="fp32", schedule="cosine", lr=0.003, min_lr=0.003, warmup=1, max_steps=1000,
                       guided_alignment=weight)  # fmt: skip


def test_training_with_the_loss_puts_the_head_on_the_copied_pieces():
    """A copy task: numbers in varied places; after the same updates the guided head attends to the
    copied source digit far more than the same head of a model trained without the loss."""
    rng = np.random.default_rng(0)

    def pair() -> tuple[list[int], list[int]]:
        digits = rng.integers(10, 20, int(rng.integers(2, 5))).tolist()
        before, after = rng.integers(4, 10, int(rng.integers(0, 4))).tolist(), [6]
        return before + digits + after, [8, *digits, 9]

    batches = [[collate([pair() for _ in range(16)])] for _ in range(150)]
    held_out = collate([pair() for _ in range(32)])
    attention = {}
    for weight in (0.0, 1.0):
        model = small_transformer(seed=1)
        trainer = Trainer(model, train_cfg(weight), torch.device("cpu"), precision="fp32", copy_keys=KEYS)
        for b in batches:
            trainer.update(b)
        results = trainer.sync()
        if weight:  # the log's figures: the loss per copied piece, falling
            assert all(r.copied > 0 for r in results)
            assert np.mean([r.align for r in results[-20:]]) < 0.5 * np.mean([r.align for r in results[:20]])
        else:
            assert all(r.copied == 0 and r.align == 0 for r in results)
        probe = GuidedAlignment(model, KEYS)
        copied = probe.targets(*held_out)
        copied[..., LEAVE_FROM:] = -1  # the copy term alone
        probe.expect(copied, torch.device("cpu"))
        model.train()(held_out.src, held_out.tgt_in)  # dropout is 0: the same function as in evaluation
        attention[weight] = np.exp(-probe.take().item() / (copied[..., COPY] >= 0).sum())  # geometric mean
    assert attention[1.0] > 0.5 and attention[1.0] > 2 * attention[0.0]


def test_the_trainer_needs_the_vocabularies_for_it():
    with pytest.raises(NmtError, match="train.guided_alignment"):
        Trainer(small_transformer(), train_cfg(0.1), torch.device("cpu"), precision="fp32")


def test_in_bf16_on_a_cpu_the_loss_trains_the_master_through_the_weight_copy():
    """bf16 on a CPU runs forward on a bf16 copy of the weights (`nmt.train.weight_copy`), on any
    CPU (without native bf16 its matmuls are emulated): the hook sits on the copy, and the loss
    still reaches the fp32 master (one update from the same weights, with and without it)."""
    batch = collate([([12, 10, 10, 15, 6], [12, 10, 10, 15, 8])])
    weights = {}
    for weight in (0.0, 1.0):
        model = small_transformer()
        cfg = TrainConfig(precision="bf16", schedule="cosine", lr=0.003, min_lr=0.003, warmup=1, max_steps=10,
                          guided_alignment=weight)  # fmt: skip
        trainer = Trainer(model, cfg, torch.device("cpu"), precision="bf16", copy_keys=KEYS)
        assert trainer.copy is not None
        trainer.update([batch])
        [result] = trainer.sync()
        if weight:
            assert trainer.guide.module is trainer.copy.model.decoder.layers[-1].cross_attn
            assert result.copied == 4 and np.isfinite(result.align) and result.align > 0
        weights[weight] = model.decoder.layers[-1].cross_attn.in_proj.weight.detach().clone()
    assert not torch.equal(weights[0.0], weights[1.0])
