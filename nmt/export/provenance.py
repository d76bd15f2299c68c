"""What an exported model was trained on, read from its run (`corpus/stats.json` and
`corpus/DATA.md`, written by `nmt download`): the same facts in every export format, so that a
model trained on research-only corpora says so wherever it goes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nmt.config import Config
from nmt.run.layout import RunDir


def training_data(run_dir: Path, config: Config) -> dict[str, Any]:
    """{"corpora": [{corpus, source, licence, research_only}], "research_only": bool} from the
    run's stats.json; for a run prepared before provenance was recorded, the configured corpus
    with its licence unknown."""
    stats = RunDir(run_dir).corpus_stats
    try:
        found = json.loads(stats.read_text(encoding="utf-8")).get("provenance")
    except (OSError, json.JSONDecodeError):
        found = None
    if isinstance(found, dict) and "corpora" in found:
        return found
    unknown = {"corpus": config.data.corpus, "source": "", "licence": "not recorded", "research_only": False}
    return {"corpora": [unknown], "research_only": False}


def data_lines(run_dir: Path, config: Config) -> list[str]:
    """The run's corpus/DATA.md (corpora and licences) without its title, for a model card; else one line."""
    card = RunDir(run_dir).data_card
    if card.is_file():
        return [line for line in card.read_text(encoding="utf-8").splitlines() if not line.startswith("# ")]
    return [f"Corpus `{config.data.corpus}`; no corpus/DATA.md in the run, so its licence is not recorded here."]
