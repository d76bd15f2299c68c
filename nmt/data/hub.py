"""Corpus splits from the Hugging Face hub, read with `datasets` from data files (no loading scripts).

`datasets` no longer runs dataset loading scripts, so a recipe names either a hub dataset that
has data files, or the hub's Parquet conversion of a script dataset: `revision` =
`"refs/convert/parquet"` and `data_dir` = the config's folder there, which holds one folder of
Parquet files per split (`<data_dir>/<split>/*.parquet`).

A split can be a fixed 1-in-N sample of a hub split (`HubSplit(every=N)`) or the rest of it
(`rest=True`), chosen by a hash of the target (English) side, so both are stable across runs and
machines and pairs sharing an English sentence land on the same side.

`nmt.data.hub_cache` downloads a split's Parquet files once and reads them from the cache;
`stream_rows` is for splits that are not Parquet files (and for `nmt.data.mono`).

Failing fast: before reading a split `check_reachable` sends one HEAD request to the hub
endpoint (`HF_ENDPOINT`, default https://huggingface.co) with a 5 s timeout; without network the
command stops at once with one line naming the dataset and how to use a mirror, instead of
`huggingface_hub`'s retries, file after file. `HF_HUB_OFFLINE=1` skips the probe (the
`datasets` cache is used). Read/connect timeouts for `huggingface_hub` are set (unless the user
set them) before `datasets` is imported.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator

from nmt.data.recipes import BadLines, HubSplit, Recipe, pair_from_record
from nmt.errors import NmtError

PROBE_SECONDS = 5.0
HUB_TIMEOUTS = {"HF_HUB_ETAG_TIMEOUT": "10", "HF_HUB_DOWNLOAD_TIMEOUT": "30"}  # seconds
MIRROR_HINT = "use a local copy: --mirror DIR or NMT_MIRROR=DIR (README: Corpora)"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def check_reachable(dataset: str) -> None:
    """Raise NmtError (one line) if the hub endpoint does not answer within PROBE_SECONDS."""
    if _offline():
        return
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=PROBE_SECONDS).close()
    except urllib.error.HTTPError as e:
        if e.code < 500:
            return  # the server answered: the hub is reachable
        reason = f"HTTP {e.code} {e.reason}"
    except (urllib.error.URLError, OSError, ValueError) as e:  # ValueError: not a URL
        reason = getattr(e, "reason", None) or e
    else:
        return
    raise NmtError(f"hub dataset {dataset}: cannot reach {endpoint} ({reason}); {MIRROR_HINT}")


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def hub_arguments(recipe: Recipe, split: HubSplit) -> tuple[str | None, dict]:
    """(config name, keyword arguments) that `datasets` takes for a recipe's hub split: its config,
    or its Parquet files (<data_dir>/<split>/*.parquet of a script dataset's conversion, with the
    revision)."""
    kwargs = dict(recipe.hub_kwargs)
    if recipe.revision:
        kwargs["revision"] = recipe.revision
    config = recipe.config
    if recipe.data_dir:
        kwargs["data_files"] = {split.split: f"{recipe.data_dir}/{split.split}/*.parquet"}
        config = None
    return config, kwargs


def _recipe_rows(recipe: Recipe, split: HubSplit) -> Iterator[object]:
    """`stream_rows` of a recipe's hub split (`hub_arguments`)."""
    config, kwargs = hub_arguments(recipe, split)
    return stream_rows(recipe.hub or "", config, split.split, label=recipe.data_dir, **kwargs)


def _record(obj: object, recipe: Recipe) -> object:
    """A flat table row as a translation record {lang: text, "label": code}; other records as they are."""
    if not recipe.columns or not isinstance(obj, dict):
        return obj
    rec = {lang: obj.get(column) for lang, column in recipe.columns}
    return rec | ({"label": obj.get(recipe.label)} if recipe.label else {})


def read_hub(
    recipe: Recipe, split: HubSplit, langs: tuple[str, str], bad: BadLines, labels: list[str] | None = None
) -> Iterator[tuple[int, str, str]]:
    """Stream (row number, source, target) of one hub split; append each kept row's label to `labels`."""
    return hub_pairs(_recipe_rows(recipe, split), recipe, split, langs, bad, labels)


def hub_pairs(
    rows: Iterable[object],
    recipe: Recipe,
    split: HubSplit,
    langs: tuple[str, str],
    bad: BadLines,
    labels: list[str] | None = None,
) -> Iterator[tuple[int, str, str]]:
    """(row number from 1, source, target) of the rows of a hub split that belong to it (the
    recipe's `keep` labels, the split's 1-in-N sample); unusable rows counted in `bad`, each
    kept row's label appended to `labels`. Streamed rows and rows read from the cached Parquet
    files (`nmt.data.hub_cache`) go through this same function."""
    for n, obj in enumerate(rows, 1):
        rec = _record(obj, recipe)
        label = rec.get("label") if isinstance(rec, dict) else None
        if recipe.keep and label not in recipe.keep:
            continue  # another language or script of the same benchmark file
        pair = pair_from_record(rec, *langs)
        if isinstance(pair, str):
            bad.add(n, pair)
        elif split.keeps(pair[1]):
            if labels is not None:
                labels.append(str(label))
            yield n, pair[0], pair[1]


def stream_rows(
    dataset: str, config: str | None, split: str, label: str | None = None, **kwargs: object
) -> Iterator[object]:
    """The rows of one hub split, streamed with `datasets` (`kwargs`: more `load_dataset`
    arguments); a probe first (`check_reachable`), and every failure, while loading or
    streaming, one NmtError line naming the dataset (`label`: what to call its config there)."""
    where = f"hub dataset {dataset} ({label or config or 'default'}, {split})"
    check_reachable(dataset)
    for key, value in HUB_TIMEOUTS.items():
        os.environ.setdefault(key, value)
    try:
        import datasets

        yield from datasets.load_dataset(dataset, config, split=split, streaming=True, **kwargs)
    except NmtError:
        raise
    except Exception as e:  # network, missing files, authentication: all fixed by the user
        raise NmtError(f"{where}: could not load ({one_line(e)}); {MIRROR_HINT}") from None
