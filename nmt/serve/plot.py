"""PNG plots with matplotlib (optional extra `nmt[serve]`): training curves and attention heatmaps.

`nmt plot --run DIR` writes `<out>/curves.png` (loss, validation BLEU, learning rate, tokens/s
on one page) and one `<out>/<tag>.png` per recorded scalar (`train_loss.png`, `valid_bleu.png`,
...); `nmt translate --attention DIR` writes `DIR/<n>.png` per input sentence.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nmt.decode.options import InferenceOptions
from nmt.errors import NmtError
from nmt.files import atomic_path
from nmt.run.log import MAIN_CURVES, Series, read_curves, require_run
from nmt.serve.attention_map import AttentionMap


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise NmtError("plots need matplotlib: pip install 'nmt[serve]'") from None
    matplotlib.use("Agg")  # files only, no display
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)  # missing CJK fonts are expected
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    with atomic_path(path) as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing")  # no CJK font installed: boxes
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def _draw_series(ax: Any, runs: dict[str, Series], title: str, unit: str) -> None:
    """One axis: a line per run (legend by run name when there are several)."""
    for name, series in runs.items():
        marker = "o" if len(series.steps) < 30 else None
        ax.plot(series.steps, series.values, marker=marker, markersize=3, label=name)
    if len(runs) > 1:
        ax.legend(fontsize="small")
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(unit)
    ax.grid(alpha=0.3)


def plot_run(run_dir: Path, out_dir: Path | None = None, compare: Sequence[Path] = ()) -> list[Path]:
    """Write the run's training curves as PNGs into `out_dir` (default `<run>/plots`); returns the files.

    `compare`: other runs drawn on the same axes (a line per run, named by its directory), e.g.
    the arms of an ablation; a curve is drawn where any of the runs recorded it."""
    dirs = [require_run(d) for d in (run_dir, *compare)]
    names = [d.resolve().name for d in dirs]
    if len(set(names)) < len(names):
        raise NmtError(f"nmt plot: two runs named alike among {[str(d) for d in dirs]} (legend by folder name)")
    runs = dict(zip(names, map(read_curves, dirs), strict=True))
    for d, curves in zip(dirs, runs.values(), strict=True):
        if not curves:
            raise NmtError(f"{d / 'tb'}: no training scalars recorded (train the run first)")
    tags = list(dict.fromkeys(tag for curves in runs.values() for tag in curves))
    by_tag = {tag: {name: c[tag] for name, c in runs.items() if tag in c} for tag in tags}
    out_dir = Path(out_dir) if out_dir is not None else dirs[0] / "plots"
    plt = _pyplot()
    main = [m for m in MAIN_CURVES if m[0] in by_tag]
    written = []
    if main:
        fig, axes = plt.subplots(len(main), 1, figsize=(7, 2.6 * len(main)), squeeze=False)
        for ax, (tag, title, unit) in zip(axes[:, 0], main, strict=True):
            _draw_series(ax, by_tag[tag], title, unit)
        fig.suptitle(f"{' vs '.join(runs)}: training")
        fig.tight_layout()
        written.append(_save(fig, out_dir / "curves.png"))
    for tag, series in by_tag.items():
        fig, ax = plt.subplots(figsize=(6, 3.2))
        _draw_series(ax, series, tag, tag.split("/")[-1])
        written.append(_save(fig, out_dir / f"{tag.replace('/', '_')}.png"))
    return written


def plot_attention(amap: AttentionMap, path: Path, title: str = "") -> Path:
    """One heatmap: target pieces down, source pieces across, darker = more attention."""
    plt = _pyplot()
    rows, cols = len(amap.target), len(amap.source)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * cols + 2), max(3.0, 0.35 * rows + 1.5)))
    image = ax.imshow(amap.weights, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(cols), amap.source, rotation=60, ha="right", fontsize=10, fontfamily=_cjk_font())
    ax.set_yticks(range(rows), amap.target, fontsize=8)
    ax.set_xlabel("source pieces")
    ax.set_ylabel("target pieces")
    if title:
        ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04)
    return _save(fig, Path(path))


def _cjk_font() -> list[str]:
    """Fonts to try for Chinese source pieces (the first installed one is used; DejaVu shows boxes)."""
    return ["Noto Sans CJK SC", "Noto Sans CJK JP", "WenQuanYi Zen Hei", "Droid Sans Fallback", "DejaVu Sans"]


def translate_with_attention(
    opts: InferenceOptions, lines: list[str], out_dir: Path, output_path: Path | None = None
) -> int:
    """`nmt translate --attention DIR`: translate `lines` like `nmt translate` (best hypothesis,
    printed or written to `output_path`) and write `DIR/<line number>.png`, the cross-attention
    heatmap of each non-blank line. Returns the number of heatmaps written."""
    from nmt.decode.translator import Translator
    from nmt.files import atomic_write_text
    from nmt.serve.attention_map import attention_map

    _pyplot()  # fail before loading the model when matplotlib is missing
    translator = Translator.from_options(opts)
    outputs = translator.translate(lines, opts.beam, 1, opts.len_penalty)
    if output_path is None:
        print("\n".join(outputs), flush=True)
    else:
        atomic_write_text(Path(output_path), "".join(o + "\n" for o in outputs))
    written = 0
    for i, (line, out) in enumerate(zip(lines, outputs, strict=True), start=1):
        if not translator.encode_sources([line])[0]:
            continue  # blank line: nothing to draw
        plot_attention(attention_map(translator, line, out), Path(out_dir) / f"{i}.png", title=f"{i}: {out}"[:100])
        written += 1
    return written
