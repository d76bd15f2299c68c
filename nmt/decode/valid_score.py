"""A model's validation BLEU as its run recorded it, and the floor `nmt backtranslate` holds a
reverse model to: synthetic sources written by a model that cannot translate are noise, and a
forward model trained on them loses to one trained without them.

Where the score is read, first found wins:

1. `final.safetensors` (the pipeline's choice): `<run>/select.stamp.json`, `valid_bleu` of the
   candidate it chose (`selected` in the checkpoint's metadata): the whole validation split,
   decoded with the run's decode settings.
2. the checkpoint's own metadata `bleu` (`best.safetensors`, or a final copied from it): the
   validation during training (`train.eval_sentences` sentences, greedy).
3. an `nmt export` directory: the checkpoint named in its manifest.json, by the same rules.

A step checkpoint or an averaged one carries no score: it is refused unless the floor is 0.
"""

from __future__ import annotations

import json
from pathlib import Path

from nmt.errors import NmtError
from nmt.run.checkpoints import read_metadata
from nmt.run.dirs import checkpoint_run
from nmt.run.layout import RunDir

MIN_VALID_BLEU = 10.0  # the default floor: below it a reverse model writes mostly broken sentences


def validation_bleu(checkpoint: Path) -> tuple[float, str] | None:
    """(validation BLEU, where it was read) of the model in `checkpoint` (a .safetensors file or
    an export directory); None when its run recorded none."""
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        manifest = _json(checkpoint / "manifest.json")
        source = manifest.get("checkpoint")
        return validation_bleu(Path(source)) if source and Path(source).is_file() else None
    if not checkpoint.is_file():
        return None
    meta = read_metadata(checkpoint)
    chosen = meta.get("selected")
    if chosen:
        stamp = RunDir(checkpoint_run(checkpoint)).stamp("select")
        score = _json(stamp).get("valid_bleu", {}).get(chosen)
        if isinstance(score, int | float):
            return float(score), f"{stamp} (valid_bleu.{chosen})"
    if "bleu" in meta:
        try:
            return float(meta["bleu"]), f"{checkpoint} (metadata bleu, validation during training)"
        except ValueError:
            return None
    return None


def require_valid_bleu(checkpoint: Path, floor: float) -> str:
    """A one-line description of `checkpoint`'s validation BLEU when it reaches `floor`; an
    NmtError naming the score, where it was read and the floor when it does not (or when there
    is no score and the floor is above 0). `floor` <= 0 accepts any model."""
    found = validation_bleu(checkpoint)
    if floor <= 0:
        return f"validation BLEU {found[0]:.2f} ({found[1]})" if found else "validation BLEU not checked"
    if found is None:
        raise NmtError(
            f"{checkpoint}: no validation BLEU recorded (run `nmt pipeline` on the reverse run, "
            f"or pass --min-valid-bleu 0 to use it anyway); the floor is {floor:g}"
        )
    score, where = found
    if score < floor:
        raise NmtError(
            f"reverse model validation BLEU {score:.2f} (read from {where}) is below the floor "
            f"{floor:g} (--min-valid-bleu): its translations would be noise; train it longer"
        )
    return f"validation BLEU {score:.2f} ({where}) >= {floor:g}"


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
