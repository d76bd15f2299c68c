"""The run log: what training writes (`RunLogWriter`) and what the server and `nmt plot` read
back (`read_curves`, `read_eval_reports`) — the one owner of its format.

- ``<run>/tb/``: TensorBoard scalars tagged ``<prefix>/<key>``: ``train/loss``, ``train/lr``,
  ``train/tokens_per_s``, ``train/mfu`` (a fraction of the measured matmul peak), ...,
  ``valid/bleu``, ``valid/loss``, ...; text ``samples/<i>``.
  Every scalar is read back (no sampling); when a step was logged twice (a resumed run), the
  later value wins.
- ``<run>/train.log``: one timestamped line per logged step, validation and event
  (``2026-12-01 16:40:02 step 25 | loss 7.7109 | ppl 1951 | lr 2.000e-04 | ... | mfu 41.3% | ...``).
- ``<run>/eval/*.json``: eval reports (`nmt/decode/evaluate.py`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nmt.errors import NmtError
from nmt.run.layout import RunDir

# the curves a person looks at first, in display order: (tag, title, y-axis label)
MAIN_CURVES = (
    ("train/loss", "training loss", "label-smoothed NLL per target token"),
    ("valid/bleu", "validation BLEU (greedy)", "BLEU"),
    ("train/lr", "learning rate", "lr"),
    ("train/tokens_per_s", "training speed", "target tokens / s"),
)


@dataclass
class Series:
    """One scalar over training steps."""

    tag: str  # e.g. "train/loss"
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


def read_curves(run_dir: Path) -> dict[str, Series]:
    """Every TensorBoard scalar of the run, by tag, steps ascending; {} when the run has no `tb/`."""
    tb = RunDir(run_dir).tb
    if not tb.is_dir() or not any(tb.glob("events.out.tfevents.*")):
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})  # 0 = keep every event
    acc.Reload()
    curves = {}
    for tag in acc.Tags().get("scalars", []):
        by_step = {int(e.step): float(e.value) for e in sorted(acc.Scalars(tag), key=lambda e: e.wall_time)}
        steps = sorted(by_step)
        curves[tag] = Series(tag, steps, [by_step[s] for s in steps])
    return curves


def curves_to_json(curves: dict[str, Series]) -> dict[str, Any]:
    """{"curves": {tag: {"steps": [...], "values": [...]}}, "main": [[tag, title, unit], ...]}."""
    return {
        "curves": {t: {"steps": s.steps, "values": s.values} for t, s in curves.items()},
        "main": [list(m) for m in MAIN_CURVES if m[0] in curves],
    }


def read_eval_reports(run_dir: Path) -> list[dict[str, Any]]:
    """The run's eval reports (`<run>/eval/*.json`), by name; unreadable files are skipped."""
    reports = []
    for path in sorted(RunDir(run_dir).eval.glob("*.json")):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(report, dict) and "bleu" in report:
            reports.append(report)
    return reports


def eval_summary(report: dict[str, Any]) -> dict[str, Any]:
    """The lines of an eval report a page shows: name, scores with signatures, decoding, speed."""
    keys = ("name", "split", "src", "checkpoint", "bleu", "chrf", "bleu_signature", "chrf_signature", "bleu_detail")
    out = {k: report.get(k) for k in keys}
    out["decode"] = {k: report.get("decode", {}).get(k) for k in ("beam", "engine", "precision", "device")}
    out["speed"] = report.get("speed")
    out["by_code"] = report.get("by_code")
    return out


def require_run(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NmtError(f"{run_dir}: run directory not found (pass --run DIR)")
    return run_dir


# --------------------------------------------------------------------------- writing


class RunLogWriter:
    """Appends to a run's log: timestamped lines in ``train.log`` and TensorBoard scalars and texts
    (the TensorBoard writer is created at the first scalar, so a run that logs none has no tb/)."""

    def __init__(self, run_dir: Path) -> None:
        self.run, self.path = RunDir(run_dir), RunDir(run_dir).train_log
        self._tb: Any = None  # torch.utils.tensorboard.SummaryWriter

    def line(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{stamp} {text}\n")

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self._writer().add_scalar(f"{prefix}/{key}", value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        self._writer().add_text(tag, text, step)

    def _writer(self) -> Any:
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run.tb))
        return self._tb

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def format_values(values: dict[str, float]) -> str:
    """'loss 3.2140 | ppl 24.88 | lr 5.000e-04 | mfu 41.3%' (4 significant figures, lr in scientific
    notation, mfu a percentage)."""
    parts = []
    for k, v in values.items():
        if isinstance(v, int):
            parts.append(f"{k} {v}")
        elif k == "mfu":
            parts.append(f"{k} {v:.1%}")
        elif k == "lr":
            parts.append(f"{k} {v:.3e}")
        else:
            parts.append(f"{k} {v:.4g}" if abs(v) >= 1000 else f"{k} {v:.4f}")
    return " | ".join(parts)
