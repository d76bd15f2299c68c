"""What each cleaning rule (the noise filters included) removes from corpora of the mirror: a
table of counts per corpus and rule, then a few removed pairs per rule, as docs/data.md shows them.

    python scripts/noise_report.py --mirror ../shared/data --config configs/small-mix.yaml [--examples 3]

Reads the training corpora of the config's `data.corpora` (each with its own filters, else
`data.filters`) and applies the same rules as `nmt download` (`nmt.data.clean.Rules`), without
the overlap guard and without dedup (`nmt download`'s report counts those): a table of what the
pair-level rules alone remove.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from nmt.config import load_config
from nmt.data.clean import RULES, Held, Rules
from nmt.data.corpora import train_corpora
from nmt.data.readers import find_sources, read_split
from nmt.data.recipes import BadLines, get_recipe
from nmt.errors import NmtError


def removed(config_path: str, mirror: str, examples: int) -> list[dict]:
    """Per training corpus: pairs read, removed per rule, and the first `examples` removed per rule."""
    config = load_config(config_path)
    data = config.data
    recipe = get_recipe(data.corpus)
    found = find_sources(recipe, data, mirror, need=("valid",) if data.corpora else ("train", "valid"))
    rows = []
    for corpus in train_corpora(recipe, found["train"], data, mirror):
        rules = Rules(dataclasses.replace(data, filters=corpus.filters), Held())
        counts, shown, read = dict.fromkeys(RULES, 0), {r: [] for r in RULES}, 0
        for _, src, tgt in read_split(corpus.source, corpus.recipe, data, BadLines(corpus.source.label)):
            read += 1
            rule, _, _ = rules(src, tgt)
            if rule is not None:
                counts[rule] += 1
                if len(shown[rule]) < examples:
                    shown[rule].append((src, tgt))
        rows.append({"corpus": corpus.name, "read": read, "removed": counts, "examples": shown})
    return rows


def markdown(rows: list[dict]) -> str:
    rules = [r for r in RULES if r != "overlap"]
    out = ["| corpus | read | " + " | ".join(rules) + " |", "|---|" + "---:|" * (len(rules) + 1)]
    for row in rows:
        counts = " | ".join(f"{row['removed'][r]:,}" for r in rules)
        out.append(f"| {row['corpus']} | {row['read']:,} | {counts} |")
    out.append("")
    for row in rows:
        for rule, pairs in row["examples"].items():
            for src, tgt in pairs:
                out.append(f"- {row['corpus']}, `{rule}`: {src[:80]!r} → {tgt[:80]!r}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/small-mix.yaml")
    parser.add_argument("--mirror", default=str(Path(__file__).resolve().parent.parent.parent / "shared" / "data"))
    parser.add_argument("--examples", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        print(markdown(removed(args.config, args.mirror, args.examples)))
    except NmtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
