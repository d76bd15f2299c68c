"""A stand-in for the Hugging Face hub, for the tests of the hub path (no network here).

`FakeHub(monkeypatch, cache, tables)` replaces `datasets.load_dataset_builder` (which resolves a
config's or a `data_files` pattern's files to `hf://datasets/<repo>@<commit>/<path>` names, as the
real one does) and `huggingface_hub.hf_hub_download` (which writes a real Parquet file of the
table, in row groups of `group_rows` rows, into the real hub cache layout
`<cache>/datasets--org--name/snapshots/<commit>/<path>`, so that the real
`try_to_load_from_cache` finds it), points the hub cache at `cache`, and stubs the reachability
probe. It counts downloads (`downloads`, one entry per file) and builder calls (`resolved`).

`tables` maps (repo, config or data_dir, hub split) to rows: `{"translation": {"zh": ..., "en": ...}}`
(the schema of wmt/wmt19) or flat rows (Tatoeba's Parquet conversion); each split is written as
`files` Parquet files.
"""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(
        self, monkeypatch, cache: Path, tables: dict, files: int = 2, group_rows: int = 7, commit: str = COMMIT
    ) -> None:
        self.cache, self.tables, self.files, self.group_rows, self.commit = (
            Path(cache),
            tables,
            files,
            group_rows,
            commit,
        )
        self.downloads: list[str] = []
        self.resolved: list[dict] = []
        import huggingface_hub
        import huggingface_hub.constants

        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(self.cache))
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", self.hf_hub_download)
        monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset_builder=self.builder))
        monkeypatch.setattr("nmt.data.hub.check_reachable", lambda dataset: None)
        monkeypatch.delenv("NMT_MIRROR", raising=False)

    def _names(self, repo: str, prefix: str, split: str, layout: str) -> list[str]:
        """The repository paths of one split: `<config>/<split>-0000i-of-0000n.parquet` (datasets'
        conversion of a config) or `<data_dir>/<split>/000i.parquet` (the hub's Parquet conversion)."""
        n = self.files
        if layout == "config":
            return [f"{prefix}/{split}-{i:05d}-of-{n:05d}.parquet" for i in range(n)]
        return [f"{prefix}/{split}/{i:04d}.parquet" for i in range(n)]

    def builder(self, path, name=None, *, data_files=None, revision=None, **kwargs):
        self.resolved.append({"path": path, "name": name, "data_files": data_files, "revision": revision, **kwargs})
        if data_files:  # {split: "<data_dir>/<split>/*.parquet"}
            split, pattern = next(iter(data_files.items()))
            prefix, layout = pattern.split("/")[0], "data_dir"
            splits = [split] if (path, prefix, split) in self.tables else []
            if not splits:
                raise FileNotFoundError(f"Unable to find 'hf://datasets/{path}@{revision}/{pattern}'")
        else:
            prefix, layout = name, "config"
            splits = [s for (repo, config, s) in self.tables if repo == path and config == name]
            if not splits:
                raise ValueError(f"BuilderConfig '{name}' not found for {path}")
        files = {
            s: [f"hf://datasets/{path}@{self.commit}/{p}" for p in self._names(path, prefix, s, layout)] for s in splits
        }
        return types.SimpleNamespace(config=types.SimpleNamespace(data_files=files))

    def hf_hub_download(self, repo_id, filename, *, repo_type=None, revision=None, cache_dir=None, **kwargs):
        assert repo_type == "dataset" and revision == self.commit, (repo_type, revision)
        prefix, rest = filename.split("/", 1)
        split = rest.split("/")[0] if "/" in rest else rest.split("-")[0]
        index = int(Path(filename).stem.split("-")[1] if "-" in Path(filename).stem else Path(filename).stem)
        rows = self.tables[(repo_id, prefix, split)]
        per = math.ceil(len(rows) / self.files)
        folder = Path(cache_dir or self.cache) / ("datasets--" + repo_id.replace("/", "--")) / "snapshots" / revision
        target = folder / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        part = rows[index * per : (index + 1) * per]
        table = pa.Table.from_pylist(part) if part else pa.Table.from_pylist(rows[:1]).slice(0, 0)
        pq.write_table(table, target, row_group_size=self.group_rows)
        self.downloads.append(filename)
        return str(target)


def translation_rows(pairs) -> list[dict]:
    """Rows in the schema of wmt/wmt19: {"translation": {"zh": ..., "en": ...}}."""
    return [{"translation": {"zh": z, "en": e}} for z, e in pairs]
