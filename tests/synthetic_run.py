"""A tiny trained run on self-made zh→en data (no corpus mirror needed): for the serve, plot,
attention-map and browser tests.

The corpus is word-for-word: random sequences of a few Chinese words and their English
glosses. `make_run` writes it as `<run>/corpus/*`, then runs the real `build_vocab`, `train`
(tiny.yaml, a few dozen steps: train.log and TensorBoard scalars are real) and `evaluate_run`
(`<run>/eval/test.json`). `final.safetensors` is the last step checkpoint.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from nmt.config import load_config, save_config

ROOT = Path(__file__).resolve().parent.parent

WORDS = {
    "我": "I", "你": "you", "他": "he", "她": "she", "爱": "love", "看": "see", "吃": "eat", "喝": "drink",
    "猫": "cats", "狗": "dogs", "鱼": "fish", "水": "water", "书": "books", "大": "big", "小": "small",
    "红": "red", "今天": "today", "明天": "tomorrow", "很": "very", "好": "good",
}  # fmt: skip

OVERRIDES = [
    "vocab.src_size=60",
    "vocab.byte_fallback=false",
    "vocab.tgt_size=60",
    "model.max_positions=48",
    "train.max_len=40",
    "train.max_steps=40",
    "train.lr=0.006",
    "train.eval_every=20",
    "train.log_every=10",
    "train.eval_sentences=10",
    "decode.batch_size=8",
    "decode.max_tokens=200",
]


def synthetic_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """`n` (zh, en) pairs of 2-6 words each."""
    rng = random.Random(seed)
    keys = list(WORDS)
    pairs = []
    for _ in range(n):
        words = [rng.choice(keys) for _ in range(rng.randint(2, 6))]
        en = " ".join(WORDS[w] for w in words)
        pairs.append(("".join(words) + "。", en[0].upper() + en[1:] + "."))
    return pairs


def make_run(root: Path) -> Path:
    """Write, vocab, train and evaluate a tiny run under `root/run`; returns the run directory."""
    from nmt.evaluate import EvalJob, evaluate_run
    from nmt.train import train
    from nmt.translate import InferenceOptions
    from nmt.vocab import build_vocab

    config = load_config(ROOT / "configs" / "tiny.yaml", OVERRIDES)
    run = root / "run"
    corpus = run / "corpus"
    corpus.mkdir(parents=True)
    for split, n, seed in (("train", 1500, 1), ("valid", 30, 2), ("test", 12, 3)):
        pairs = synthetic_pairs(n, seed)
        (corpus / f"{split}.zh").write_text("".join(zh + "\n" for zh, _ in pairs), encoding="utf-8")
        (corpus / f"{split}.en").write_text("".join(en + "\n" for _, en in pairs), encoding="utf-8")
    save_config(config, run / "config.yaml")
    build_vocab(config, run)
    train(config, run)
    latest = max((run / "checkpoints").glob("step_*.safetensors"), key=lambda p: int(p.stem.split("_")[1]))
    shutil.copyfile(latest, run / "checkpoints" / "final.safetensors")  # as the pipeline's final model
    evaluate_run(config, run, EvalJob(split="test"), InferenceOptions(run_dir=run, precision="fp32"), quiet=True)
    return run


_RUNS: dict[str, Path] = {}


def shared_run(tmp_path_factory) -> Path:
    """`make_run` once per test session (several test modules share it; treat it as read-only)."""
    if "run" not in _RUNS:
        _RUNS["run"] = make_run(tmp_path_factory.mktemp("synthetic"))
    return _RUNS["run"]
