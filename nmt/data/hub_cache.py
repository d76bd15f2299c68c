"""A hub split downloaded once: its Parquet files kept in the Hugging Face hub cache and read
from there, row group by row group, by the cleaning workers (`nmt.data.units`).

Which files make a split is what `datasets` itself resolves for the recipe (its config, or the
`data_files` of a Parquet conversion): `datasets.load_dataset_builder` answers with
`hf://datasets/<repo>@<commit>/<path>` names and downloads nothing. Each file is then fetched
with `huggingface_hub.hf_hub_download` at that commit into the hub cache (`HF_HUB_CACHE`, under
`HF_HOME`): stored once, resumed when interrupted, shared with every other tool that uses the
cache. The Parquet files rather than `datasets`' Arrow cache: `load_dataset` would first rewrite
the 3.6 GB of Parquet as 6.4 GB of Arrow in one process, while the Parquet files are already cut
into row groups that workers read on their own.

What was resolved is remembered beside the files, in `<repo's cache folder>/nmt/<revision>.
<config>.<split>.json` ({"repo", "commit", "files"}): a later preparation finds every file in the
cache at that commit (`try_to_load_from_cache`) and uses no network at all, not even the
reachability probe, so it works offline too. A file pruned from the cache is fetched again at
the recorded commit; deleting the index file picks up a newer revision of the dataset.

A split whose data files are not Parquet is streamed as before (`nmt.data.hub.stream_rows`).
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nmt.data import hub
from nmt.data.hub import HUB_TIMEOUTS, MIRROR_HINT, one_line
from nmt.data.recipes import HubSplit, Recipe
from nmt.errors import NmtError
from nmt.files import atomic_write_json

_HF_URL = re.compile(r"hf://datasets/(?P<repo>[^@]+)@(?P<revision>[^/]+)/(?P<path>.+)")
BATCH_ROWS = 10_000  # rows decoded at a time from a row group (a row group may hold millions)


@dataclass(frozen=True)
class HubFiles:
    """The files of one hub split at one commit: `paths` in the repository, `local` in the cache."""

    repo: str
    commit: str
    paths: tuple[str, ...]
    local: tuple[Path, ...]

    @property
    def ref(self) -> str:
        """What the files are, for the preparation's stamp: the repository, commit and paths."""
        return f"{self.repo}@{self.commit}:{','.join(self.paths)}"


def cache_dir() -> Path:
    import huggingface_hub.constants

    return Path(huggingface_hub.constants.HF_HUB_CACHE)


def _where(recipe: Recipe, split: HubSplit) -> str:
    return f"hub dataset {recipe.hub} ({recipe.data_dir or recipe.config or 'default'}, {split.split})"


def _index_path(recipe: Recipe, split: HubSplit) -> Path:
    repo_folder = "datasets--" + (recipe.hub or "").replace("/", "--")  # the hub cache's own folder name
    name = f"{recipe.revision or 'main'}.{recipe.data_dir or recipe.config or 'default'}.{split.split}.json"
    return cache_dir() / repo_folder / "nmt" / urllib.parse.quote(name, safe=".-_")


def split_files(recipe: Recipe, split: HubSplit) -> HubFiles | None:
    """The local Parquet files of one hub split, downloaded first where missing; None when the
    split's data files are not Parquet (read it with `stream_rows`). NmtError (one line) when the
    hub cannot be reached or answers with an error."""
    index = _index_path(recipe, split)
    try:
        known = json.loads(index.read_text(encoding="utf-8"))
        repo, commit, paths = known["repo"], known["commit"], tuple(known["files"])
    except (OSError, ValueError, KeyError, TypeError):
        repo = commit = ""
        paths = ()
    local = [_cached(repo, commit, p) for p in paths]
    if paths and all(local):
        return HubFiles(repo, commit, paths, tuple(local))  # type: ignore[arg-type]
    hub.check_reachable(recipe.hub or "")  # looked up here, so that a test's stand-in is the one called
    for key, value in HUB_TIMEOUTS.items():
        os.environ.setdefault(key, value)
    try:
        if not paths:
            resolved = _resolve(recipe, split)
            if resolved is None:
                return None
            repo, commit, paths = resolved
            local = [None] * len(paths)
        got = tuple(have or _fetch(repo, commit, p) for have, p in zip(local, paths, strict=True))
        files = HubFiles(repo, commit, paths, got)
    except NmtError:
        raise
    except Exception as e:  # network, missing files, authentication: all fixed by the user
        raise NmtError(f"{_where(recipe, split)}: could not download ({one_line(e)}); {MIRROR_HINT}") from None
    index.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(index, {"repo": repo, "commit": commit, "files": list(paths)})
    return files


def _resolve(recipe: Recipe, split: HubSplit) -> tuple[str, str, tuple[str, ...]] | None:
    """(repository, commit, paths) of the split's data files as `datasets` resolves them; None
    when they are not all Parquet files of one hub commit."""
    import datasets

    config, kwargs = hub.hub_arguments(recipe, split)
    builder = datasets.load_dataset_builder(recipe.hub, config, **kwargs)
    names = [str(f) for f in (builder.config.data_files or {}).get(split.split, [])]
    if not names:
        raise NmtError(f"{_where(recipe, split)}: the dataset has no such split; {MIRROR_HINT}")
    found = [_HF_URL.fullmatch(n) for n in names]
    if not all(m and m["path"].endswith(".parquet") for m in found):
        return None
    commits = {(m["repo"], urllib.parse.unquote(m["revision"])) for m in found if m}
    if len(commits) != 1:
        return None
    repo, commit = commits.pop()
    return repo, commit, tuple(m["path"] for m in found if m)


def _cached(repo: str, commit: str, path: str) -> Path | None:
    """The cached file of `path` at `commit`, or None (no network)."""
    if not (repo and commit):
        return None
    import huggingface_hub

    found = huggingface_hub.try_to_load_from_cache(
        repo, path, cache_dir=cache_dir(), revision=commit, repo_type="dataset"
    )
    return Path(found) if isinstance(found, str) else None


def _fetch(repo: str, commit: str, path: str) -> Path:
    """`path` of the dataset repository at `commit`, from the cache or downloaded into it."""
    import huggingface_hub

    return Path(
        huggingface_hub.hf_hub_download(repo, path, repo_type="dataset", revision=commit, cache_dir=cache_dir())
    )


# --------------------------------------------------------------------------- reading


def row_group_units(paths: tuple[Path, ...], rows: int) -> list[tuple[Path, int, int]]:
    """The split cut into units of whole row groups, in file order: (file, first row group,
    number of row groups), consecutive groups of one file joined until they hold `rows` rows.
    Read from the files' footers only; fixed by the files, whatever the number of workers."""
    import pyarrow.parquet as pq

    units = []
    for path in paths:
        meta = pq.ParquetFile(path).metadata
        first, held = 0, 0
        for g in range(meta.num_row_groups):
            held += meta.row_group(g).num_rows
            if held >= rows:
                units.append((path, first, g + 1 - first))
                first, held = g + 1, 0
        if first < meta.num_row_groups:
            units.append((path, first, meta.num_row_groups - first))
    return units


def parquet_rows(path: Path, first: int = 0, count: int | None = None) -> Iterator[dict]:
    """The rows of row groups [first, first + count) of a Parquet file (all from `first` when
    `count` is None) as dicts, decoded BATCH_ROWS at a time."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as f:
        end = f.metadata.num_row_groups if count is None else first + count
        if end > first:
            for batch in f.iter_batches(batch_size=BATCH_ROWS, row_groups=range(first, end)):
                yield from batch.to_pylist()


def hub_rows(files: HubFiles) -> Iterator[dict]:
    """Every row of a cached split, file after file."""
    for path in files.local:
        yield from parquet_rows(path)
