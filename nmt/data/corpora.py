"""The training data of a run: the train split of `data.corpus`, or the corpora of `data.corpora`,
each with its weight (upsampling, as OpenNMT-py's and fairseq's corpus weights).

An entry is a recipe (`{corpus: NAME}`: its train split, from the mirror's folder of that recipe
or from the hub) or a local path (`{path: DIR}`: a folder laid out like a mirror folder, or one
file, `nmt.data.readers.path_source`). Validation and test always come from `data.corpus` (or
`data.valid` / `data.test`), whatever the training corpora are.

Each corpus is cleaned on its own units (`nmt.data.clean`, the overlap guard of valid and test
applied to all, its own noise filters: the entry's `filters`, else `data.filters`); then
duplicates are dropped over all of them in corpus order (a pair of the second corpus already in
the first is a `duplicate` of the second), then near-duplicates among the corpora whose filters
ask for it (`near_duplicate`: the same pair but for case, spaces and punctuation), `data.max_train_pairs`
draws over all the unique pairs, and the pairs are written corpus after corpus, unit after unit,
each kept pair `weight` times (times `data.backtranslation.real_upsample`): a fractional weight
such as 1.5 writes every pair once and a seeded half of them (chosen by pair hash) once more. The output depends
on the inputs, the settings and the seed only, never on the number of workers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmt.config import DataConfig, FilterConfig
from nmt.data.clean import Cleaned, Held, clean_units, unit_path
from nmt.data.dedup import first_occurrences
from nmt.data.readers import Source, cached_hub, find_sources, path_source
from nmt.data.recipes import Recipe, get_recipe


@dataclass(frozen=True)
class TrainCorpus:
    """One training corpus: where its train split is, how its records read, how often it is written."""

    name: str  # the recipe name or the path, for the report
    source: Source
    recipe: Recipe  # a hub recipe's columns and samples; a file's records read the same for any recipe
    weight: float = 1.0
    filters: FilterConfig = dataclasses.field(default_factory=FilterConfig)  # its noise filters


@dataclass(frozen=True)
class Unique:
    """Per corpus, per unit, the mask of the pairs that repeat no earlier pair, and per corpus the
    pairs dropped as near-duplicates (not counted as exact duplicates)."""

    masks: list[list[np.ndarray]]
    near: list[int]


def train_corpora(recipe: Recipe, train: Source, data: DataConfig, mirror: str | None) -> list[TrainCorpus]:
    """The training corpora of the config: `data.corpora`'s, or the train split of `data.corpus`
    (`recipe`; `train`, already found) when it is empty. Every corpus is found before any hub
    split is downloaded (once, here), so a missing one stops the run before any work."""
    if not data.corpora:
        return [TrainCorpus(recipe.name, cached_hub(train, recipe), recipe, filters=data.filters)]
    found = []
    for i, entry in enumerate(data.corpora):
        key = f"data.corpora[{i}]"
        filters = entry.filters or data.filters
        if entry.corpus:
            own = get_recipe(entry.corpus, f"{key}.corpus")
            where = find_sources(own, data, mirror, need=("train",), key=f"{key}.corpus", own_folder=True)
            found.append(TrainCorpus(entry.corpus, where["train"], own, entry.weight, filters))
        else:
            source = path_source(entry.path, data, "train", f"{key}.path")
            found.append(TrainCorpus(entry.path, source, recipe, entry.weight, filters))
    return [dataclasses.replace(c, source=cached_hub(c.source, c.recipe)) for c in found]


def clean_corpora(
    corpora: list[TrainCorpus], data: DataConfig, held: Held, folders: list[Path], digest: str
) -> tuple[list[Cleaned], Unique]:
    """Each corpus cleaned into its folder (`folders[i]`) with its own filters; which of its pairs
    repeat no earlier pair of any corpus (all without `data.dedup`)."""
    cleaned = [
        clean_units(c.source, c.recipe, dataclasses.replace(data, filters=c.filters), held, folder, digest)
        for c, folder in zip(corpora, folders, strict=True)
    ]
    if not data.dedup:
        return cleaned, Unique([[np.ones(n, dtype=bool) for n in c.kept] for c in cleaned], [0] * len(cleaned))
    keys = [unit_path(c.folder, i, ".keys.npy") for c in cleaned for i in range(len(c.counts))]
    masks = per_corpus(first_occurrences(keys, folders[0]), [len(c.counts) for c in cleaned])
    return cleaned, Unique(masks, _drop_near(cleaned, [c.filters.near_dup for c in corpora], masks, folders[0]))


def _drop_near(cleaned: list[Cleaned], near: list[bool], masks: list[list[np.ndarray]], scratch: Path) -> list[int]:
    """Clear, in `masks`, the pairs of the corpora with `near[i]` whose near-duplicate key
    (`.near.npy`) an earlier pair of those corpora has; per corpus, how many were cleared."""
    chosen = [i for i, on in enumerate(near) if on]
    dropped = [0] * len(cleaned)
    if not chosen:
        return dropped
    files = [unit_path(cleaned[i].folder, u, ".near.npy") for i in chosen for u in range(len(cleaned[i].counts))]
    firsts = iter(first_occurrences(files, scratch))
    for i in chosen:
        for u, mask in enumerate(masks[i]):
            kept = mask & next(firsts)
            dropped[i] += int(mask.sum()) - int(kept.sum())
            masks[i][u] = kept
    return dropped


def per_corpus(masks: list[np.ndarray], sizes: list[int]) -> list[list[np.ndarray]]:
    """A flat list of unit masks cut back into one list per corpus (`sizes`: units per corpus)."""
    bounds = np.cumsum([0, *sizes])
    return [masks[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def pair_copies(cleaned: Cleaned, weight: float, seed: int) -> int | list[np.ndarray]:
    """How many times each pair of a corpus is written for `weight` (>= 1): the whole number,
    or, for a fractional weight, per unit an array: floor(weight) for every pair and one more
    for the pairs whose seeded hash falls below the fraction (a fixed subset, set by the pairs
    and `seed`, never by the workers)."""
    whole = int(weight)
    if weight == whole:
        return whole
    return [
        whole + (_uniform(np.load(unit_path(cleaned.folder, i, ".keys.npy")), seed) < weight - whole)
        for i in range(len(cleaned.counts))
    ]


def written_pairs(copies: int | list[np.ndarray], masks: list[np.ndarray]) -> int:
    """The lines a corpus writes: its kept pairs (`masks`) times their copies (`pair_copies`)."""
    if isinstance(copies, int):
        return copies * sum(int(m.sum()) for m in masks)
    return sum(int(n[m].sum()) for n, m in zip(copies, masks, strict=True))


def _uniform(keys: np.ndarray, seed: int) -> np.ndarray:
    """A number in [0, 1) per 64-bit pair hash, mixed with `seed` (splitmix64's finaliser)."""
    x = keys.astype(np.uint64) ^ np.uint64((seed * 0x9E3779B97F4A7C15) % (1 << 64))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
