"""Training end to end on synthetic tasks and a real corpus (nmt/train/loop.py `fit`): a copy task
learned in fp32 and bf16, bit-exact resume (after a stop, a partial checkpoint or a SIGKILL), batches
built ahead, read-backs, the stopping rules in a run. Every test trains a model: the slow tier. The
objective, schedules, a single update and the stopping rules on their own: test_objective.py,
test_update.py, test_stopping.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from learning import TEST_SEED, assert_learned
from toy_runs import Steps

from nmt.config import Config, load_config
from nmt.data import encoded
from nmt.errors import NmtError
from nmt.hw.device import training_precision
from nmt.run import weights as ckpt
from nmt.run.layout import RunDir
from nmt.run.log import read_curves
from nmt.train import loop, stopping
from nmt.train.loop import fit
from nmt.train.update import Trainer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"


# --------------------------------------------------------------------------- helpers


def write_pairs(run: Path, split: str, pairs: list[tuple[list[int], list[int]]], langs=("zh", "en")) -> None:
    """Write <run>/bin/{split} from id pairs with `nmt.data.encoded.write_split`: one shard, pairs
    in the given order (an encoded split already there is replaced)."""
    sides, vocab = {}, {}
    for side, lang in enumerate(langs):
        seqs = [np.asarray(p[side], dtype=np.int32) for p in pairs]
        flat = np.concatenate(seqs)
        sides[lang] = [(flat, np.array([len(s) for s in seqs]))]
        vocab[lang] = int(flat.max(initial=0)) + 1  # only the token dtype depends on it
    encoded.write_split(RunDir(run).bin, split, sides, vocab)


def synthetic_run(run: Path, task: str, n_train: int, n_valid: int, vocab: int = 20, hi: int = 8) -> None:
    """Random sequences over ids 4..vocab-1; target = copy or reverse of the source."""
    rng = np.random.default_rng(123)

    def pairs(n: int) -> list[tuple[list[int], list[int]]]:
        out = []
        for _ in range(n):
            s = rng.integers(4, vocab, rng.integers(2, hi + 1)).tolist()
            out.append((s, s if task == "copy" else s[::-1]))
        return out

    write_pairs(run, "train", pairs(n_train))
    write_pairs(run, "valid", pairs(n_valid))


SYNTH = [
    "vocab.src_size=20", "vocab.tgt_size=20", "model.d_model=64", "model.heads=4", "model.encoder_layers=2",
    "model.decoder_layers=2", "model.ffn_dim=128", "train.threads=1", "train.max_tokens=1024",
]  # fmt: skip


def synth_config(*overrides: str) -> Config:
    return load_config(TINY, [*SYNTH, *overrides])


# --------------------------------------------------------------------------- end to end (synthetic)


def copy_task(run: Path, precision: str) -> dict:
    """Train the copy task (4,000 pairs, 220 updates) in `precision` into `run`; the summary. The
    cosine schedule anneals to min_lr by the last step, so the last evaluation is of a settled model:
    at a constant 5e-3 the BLEU of one evaluation swung between 83 and 98 from one kernel set to
    another (an Intel Xeon with AMX against AMD EPYC)."""
    synthetic_run(run, "copy", n_train=4000, n_valid=200)
    config = synth_config(
        "train.lr=0.005", "train.warmup=50", "train.schedule=cosine", "train.min_lr=1e-4", "train.max_steps=220",
        "train.label_smoothing=0.0", "train.eval_every=110", "train.eval_sentences=200", "train.log_every=20",
        f"train.seed={TEST_SEED}", f"train.precision={precision}",
    )  # fmt: skip
    return fit(config, run)


@pytest.fixture(scope="module")
def copy_runs(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """The copy task trained in fp32 and in bf16 (where this CPU runs bf16 matmuls at all): run, summary."""
    from nmt.hw import host

    precisions = ["fp32", "bf16"] if host.current().has("matmul-bf16") else ["fp32"]
    runs = {p: tmp_path_factory.mktemp("copy") / p for p in precisions}
    return {p: (run, copy_task(run, p)) for p, run in runs.items()}


@pytest.mark.learning
def test_copy_task_reaches_high_bleu(copy_runs):
    """Bound: the spread over CPU kinds and seeds in docs/BENCHMARKS.md ("Learning tests on every CPU kind")."""
    run, summary = copy_runs["fp32"]
    assert summary["steps"] == 220 and summary["stopped"] == "max_steps"
    assert_learned("copy/best_bleu", summary["best_bleu"], 95)
    assert summary["tokens_per_s"] > 0
    log = (run / "train.log").read_text()
    assert "valid step 220" in log and "sample 3" in log and "padding_waste" in log
    assert "matmul peak" in log and all(" | mfu " in line for line in log.splitlines() if "| tokens_per_s" in line)
    mfu = read_curves(run)["train/mfu"]
    assert mfu.steps == list(range(20, 221, 20)) and all(0 < v < 1.5 for v in mfu.values)
    d = run / "checkpoints"
    assert (d / "best.safetensors").is_file() and summary["checkpoint"] == str(d / "step_220.safetensors")
    assert [s for s, _ in ckpt.step_checkpoints(d)] == [110, 220]


def resume_config(steps: int, *extra: str) -> Config:
    return synth_config(
        "model.dropout=0.2", "train.max_tokens=200", "train.warmup=5", f"train.max_steps={steps}",
        "train.eval_every=6", "train.eval_sentences=8", "train.keep_last=10", "train.log_every=3", *extra,
    )  # fmt: skip


def test_resume_continues_exactly(tmp_path):
    synthetic_run(tmp_path / "a", "reverse", n_train=150, n_valid=16)
    synthetic_run(tmp_path / "b", "reverse", n_train=150, n_valid=16)
    full = Steps()
    fit(resume_config(24), tmp_path / "a", on_step=full)
    first, second = Steps(), Steps()
    fit(resume_config(12), tmp_path / "b", on_step=first)
    summary = fit(resume_config(24), tmp_path / "b", on_step=second)
    assert summary["steps"] == 24 and summary["epochs"] > 1  # crossed epoch boundaries
    assert first.losses == full.losses[:12]
    assert second.losses == full.losses[12:]  # bit-identical: data order, RNG, optimizer, schedule
    wa, _ = ckpt.load_weights(tmp_path / "a" / "checkpoints" / "step_24.safetensors")
    wb, _ = ckpt.load_weights(tmp_path / "b" / "checkpoints" / "step_24.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert "resumed from" in (tmp_path / "b" / "train.log").read_text()
    # restart=True throws the checkpoints away and starts over
    again = Steps()
    fit(resume_config(6), tmp_path / "b", restart=True, on_step=again)
    assert again.losses == full.losses[:6]
    assert [s for s, _ in ckpt.step_checkpoints(tmp_path / "b" / "checkpoints")] == [6]


def test_prefetched_batches_train_bit_identically_and_save_the_same_position(tmp_path, monkeypatch):
    """The GPU path's background batch building, forced on the CPU: same losses, weights and data
    position in every checkpoint as batches built on use, also across a resume."""
    synthetic_run(tmp_path / "sync", "reverse", n_train=150, n_valid=16)
    synthetic_run(tmp_path / "ahead", "reverse", n_train=150, n_valid=16)
    sync = Steps()
    fit(resume_config(18), tmp_path / "sync", on_step=sync)
    monkeypatch.setattr(loop, "PREFETCH_DEVICES", ("cpu",))
    ahead = Steps()
    fit(resume_config(12), tmp_path / "ahead", on_step=ahead)
    fit(resume_config(18), tmp_path / "ahead", on_step=ahead)
    assert ahead.losses == sync.losses and len(sync.losses) == 18
    for step in (6, 12, 18):
        name = f"step_{step}.safetensors"
        a, b = (ckpt.load_trainer_state(tmp_path / r / "checkpoints" / name)["train"] for r in ("sync", "ahead"))
        assert (a["epoch"], a["batch_in_epoch"], a["tokens"]) == (b["epoch"], b["batch_in_epoch"], b["tokens"])
    wa, _ = ckpt.load_weights(tmp_path / "sync" / "checkpoints" / "step_18.safetensors")
    wb, _ = ckpt.load_weights(tmp_path / "ahead" / "checkpoints" / "step_18.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_loop_reads_back_only_at_log_evaluation_and_stop_points(tmp_path, monkeypatch):
    synthetic_run(tmp_path / "r", "reverse", n_train=150, n_valid=16)
    read_backs = []
    read_back = Trainer._read_back

    def counted(self):
        if self._issued:
            read_backs.append((self.state.step, len(self._issued)))
        read_back(self)

    monkeypatch.setattr(Trainer, "_read_back", counted)
    steps = Steps()
    fit(resume_config(14, "train.log_every=4", "train.eval_every=6"), tmp_path / "r", on_step=steps)
    # (provisional step, updates read back): log points 4, 8, 12; evaluations 6, 12; the stop at 14
    assert read_backs == [(4, 4), (6, 2), (8, 2), (12, 4), (14, 2)]
    assert [r.step for r in steps.results] == list(range(1, 15))


def test_resume_skips_a_partial_newest_checkpoint(tmp_path):
    run = tmp_path / "r"
    synthetic_run(run, "reverse", n_train=150, n_valid=16)
    fit(resume_config(12), run)
    d = run / "checkpoints"
    ckpt.state_path(d / "step_12.safetensors").unlink()  # weights present, state missing
    steps = Steps()
    summary = fit(resume_config(18), run, on_step=steps)
    assert len(steps.results) == 12 and summary["steps"] == 18  # resumed from step 6
    assert "step_6.safetensors" in (run / "train.log").read_text()


def test_stopping_rules(tmp_path, monkeypatch):
    synthetic_run(tmp_path / "s", "reverse", n_train=150, n_valid=8)
    base = ["train.max_tokens=200", "train.eval_sentences=8", "train.max_steps=1000"]
    # lr ~ 0: BLEU never improves after the first evaluation → stop after `patience` more
    s = fit(synth_config(*base, "train.lr=0.000000001", "train.eval_every=2", "train.patience=2"), tmp_path / "s")
    assert (s["stopped"], s["steps"], s["best_step"]) == ("patience", 6, 2)
    s = fit(synth_config(*base, "train.eval_every=500", "train.max_epochs=1"), tmp_path / "s", restart=True)
    assert s["stopped"] == "max_epochs" and s["epochs"] == 1.0
    assert s["checkpoint"].endswith(f"step_{s['steps']}.safetensors")  # final eval + checkpoint off-schedule
    fake = FakeClock(step=0.01)  # every reading of the loop's clock is 10 ms later: no real waiting
    monkeypatch.setattr(stopping, "clock", fake)
    s = fit(synth_config(*base, "train.eval_every=500", "train.max_time=1s"), tmp_path / "s", restart=True)
    assert s["stopped"] == "max_time" and 0 < s["steps"] < 1000 and s["elapsed_s"] >= 1.0
    assert s["checkpoint"].endswith(f"step_{s['steps']}.safetensors")


KILL_SCRIPT = """
import sys
from pathlib import Path
sys.path[:0] = [{tests!r}, str(Path({tests!r}).parent)]  # test_train, and the learning helper it imports
from test_train import resume_config
from nmt.train.loop import train
train(resume_config(100000, "train.eval_every=4"), Path({run!r}))
"""


def test_sigkill_mid_run_then_resume(tmp_path):
    run = tmp_path / "k"
    synthetic_run(run, "reverse", n_train=150, n_valid=16)
    script = KILL_SCRIPT.format(tests=str(Path(__file__).parent), run=str(run))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while len(ckpt.complete_checkpoints(run / "checkpoints")) < 2:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        time.sleep(0.15)  # land somewhere in the middle of later steps / checkpoint writes
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    d = run / "checkpoints"
    for weights in ckpt.complete_checkpoints(d):
        ckpt.load_weights(weights)
        assert ckpt.load_trainer_state(weights)["train"]["step"] == ckpt.checkpoint_step(weights)
    ckpt.load_weights(d / "best.safetensors")
    last = ckpt.checkpoint_step(ckpt.latest_checkpoint(d))
    steps = Steps()
    summary = fit(resume_config(last + 4), run, on_step=steps)
    assert summary["steps"] == last + 4 and steps.results[0].step == last + 1
    assert f"resumed from {d / f'step_{last}.safetensors'}" in (run / "train.log").read_text()


@pytest.mark.learning
@pytest.mark.precision
def test_bf16_training_reaches_the_bleu_of_fp32(copy_runs):
    """train.precision auto picks bf16 on every host with fast bf16 matmuls: the same task, seed and
    updates trained in bf16 (on a CPU: a bf16 copy of the weights, `nmt.train.weight_copy`) reach
    fp32's BLEU within `BF16_MARGIN` (the spread over kinds and seeds: docs/BENCHMARKS.md)."""
    if "bf16" not in copy_runs:
        pytest.skip("this CPU runs no bf16 matmul (nmt doctor: matmul-bf16)")
    fp32, bf16 = copy_runs["fp32"][1]["best_bleu"], copy_runs["bf16"][1]["best_bleu"]
    assert_learned("copy/bf16_bleu", bf16, 95)
    assert_learned("copy/bf16_minus_fp32_bleu", bf16 - fp32, -BF16_MARGIN)


BF16_MARGIN = 2.0  # BLEU points


# --------------------------------------------------------------------------- real data


@pytest.mark.learning
def test_overfits_32_validation_pairs(tmp_path, any_mirror):
    from nmt.data.corpus import prepare_corpus
    from nmt.data.encoded import ParallelSplit
    from nmt.data.tokenizer import load_tokenizers
    from nmt.data.vocab import build_vocab
    from nmt.model.transformer import build_model
    from nmt.train.validation import Validator

    run = tmp_path / "real"
    config = load_config(TINY, [
        "model.d_model=64", "model.heads=4", "model.ffn_dim=128", "model.encoder_layers=2", "model.decoder_layers=2",
        "train.threads=1", "train.label_smoothing=0.0", "train.lr=0.003", "train.warmup=20", "train.max_steps=150",
        "train.eval_every=150", "train.eval_sentences=32", "train.log_every=25",
        "decode.max_len_b=40",  # tiny vocabularies spell short sources in many target pieces
        f"train.seed={TEST_SEED}",
    ])  # fmt: skip
    prepare_corpus(config, run, mirror=str(any_mirror))
    build_vocab(config, run)
    valid = ParallelSplit.open(run, "valid", config)
    keep = [i for i in range(len(valid)) if 0 < valid.src_lengths[i] <= 20 and 0 < valid.tgt_lengths[i] <= 20][:32]
    pairs = [tuple(x.tolist() for x in valid.pair(i)) for i in keep]
    for lang in ("zh", "en"):  # the 32 pairs become both the training set and the raw references
        lines = (run / "corpus" / f"valid.{lang}").read_text(encoding="utf-8").split("\n")
        (run / "corpus" / f"valid.{lang}").write_text("\n".join(lines[i] for i in keep) + "\n", encoding="utf-8")
    write_pairs(run, "train", pairs)
    write_pairs(run, "valid", pairs)

    steps = Steps()
    summary = fit(config, run, on_step=steps)
    assert_learned("overfit-32/final_loss", float(np.mean(steps.losses[-5:])), 0.05, above=False)
    assert_learned("overfit-32/valid_bleu", summary["valid_bleu"], 90)
    tensors, saved = ckpt.load_weights(Path(summary["checkpoint"]))
    src_tok, tgt_tok = load_tokenizers(run, saved)
    model = build_model(saved, src_tok.vocab_size, tgt_tok.vocab_size)
    model.load_state_dict(tensors)
    valid = ParallelSplit.open(run, "valid", saved)
    cpu = torch.device("cpu")
    validator = Validator(saved, run, valid, cpu, tgt_tok, precision=training_precision(cpu, saved.train.precision))
    hyps = validator.translate(model)
    exact = sum(h == r for h, r in zip(hyps, validator.refs, strict=True))
    assert_learned("overfit-32/exact_of_32", exact, 27.5)


class FakeClock:
    """`nmt.train.stopping.clock` that advances `step` seconds per reading (and by hand)."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_max_time_counts_validation_and_checkpoints(tmp_path, monkeypatch):
    """train.max_time is training-loop wall time: slow validations use it up."""
    from nmt.train.validation import Validator

    synthetic_run(tmp_path / "t", "reverse", n_train=150, n_valid=8)
    run = Validator.run
    fake = FakeClock(step=0.0)  # the clock moves only when a validation "takes" 0.5 s
    monkeypatch.setattr(stopping, "clock", fake)

    def slow_run(self, model):
        fake.now += 0.5
        return run(self, model)

    monkeypatch.setattr(Validator, "run", slow_run)
    config = synth_config("train.max_tokens=200", "train.eval_sentences=8", "train.max_steps=1000",
                          "train.eval_every=1", "train.max_time=1s")  # fmt: skip
    s = fit(config, tmp_path / "t")
    assert s["stopped"] == "max_time" and s["elapsed_s"] >= 1.0
    assert s["steps"] == 2  # each step costs 0.5 s of validation on the loop's clock, updates none
    log = (tmp_path / "t" / "train.log").read_text()
    assert "training-loop wall time, validation and checkpoints included" in log
    state = ckpt.load_trainer_state(ckpt.latest_checkpoint(tmp_path / "t" / "checkpoints"))
    assert state["train"]["elapsed"] >= 1.0  # saved, so a resumed run continues the same budget


# --------------------------------------------------------------------------- shared piece rows


def test_shared_piece_rows_train_into_ordinary_checkpoints(trained_run):
    """train.share_piece_embeddings: every checkpoint written, the moving average's included,
    holds source rows equal to the target rows they read (nmt/model/shared_rows.py), so that
    decoding and export need nothing of it; the other rows are the source table's own."""
    from conftest import TINY_LEARNS

    from nmt.data.tokenizer import load_tokenizers, shared_pieces

    overrides = ["train.share_piece_embeddings=true", "train.max_steps=6", "train.eval_every=3", "train.ema_decay=0.9"]
    config = load_config(TINY, [*TINY_LEARNS, *overrides])
    fit(config, trained_run, restart=True)
    pairs = torch.from_numpy(shared_pieces(*load_tokenizers(trained_run, config)))
    unshared = sorted(set(range(4, 40)) - set(pairs[:, 0].tolist()))
    checkpoints = trained_run / "checkpoints"
    written = [*ckpt.complete_checkpoints(checkpoints), checkpoints / "best.safetensors"]
    for path in written:
        weights, _ = ckpt.load_weights(path)
        src, tgt = weights["src_embed.weight"], weights["tgt_embed.weight"]
        assert torch.equal(src[pairs[:, 0]], tgt[pairs[:, 1]]), path.name
        assert not torch.equal(src[unshared], tgt[unshared]), path.name
    assert len(written) >= 3
    assert f"{len(pairs)} source pieces read the target table's rows" in (trained_run / "train.log").read_text()


def test_shared_piece_rows_need_the_run_vocabularies(tmp_path):
    synthetic_run(tmp_path / "r", "copy", n_train=20, n_valid=4)
    with pytest.raises(NmtError, match="train.share_piece_embeddings: needs the run's vocabularies"):
        fit(synth_config("train.share_piece_embeddings=true", "train.max_steps=1"), tmp_path / "r")
