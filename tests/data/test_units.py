"""Units: fixed by the input alone, covering every line once, starting at line starts."""

from __future__ import annotations

import random

import pytest

from nmt.config import DataConfig
from nmt.data import units
from nmt.data.readers import Source
from nmt.data.recipes import RECIPES, BadLines
from nmt.errors import NmtError


def _random_lines(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [("x" * rng.randrange(0, 40) + f" {i}").encode() for i in range(n)]


def _read_units(source: Source, data: DataConfig) -> tuple[int | None, list[tuple[str, str]], list[int]]:
    total, planned = units.plan_units(source, RECIPES["tatoeba"], data, BadLines("x"))
    rows, sizes = [], []
    for unit in planned:
        lines = [0]
        rows += [(s, t) for _, s, t in units.unit_records(unit, data, BadLines("u"), lines)]
        sizes.append(lines[0])
    return total, rows, sizes


@pytest.mark.parametrize("trailing_newline", [True, False])
def test_byte_ranges_cover_every_line_once(tmp_path, monkeypatch, trailing_newline):
    monkeypatch.setattr(units, "UNIT_BYTES", 64)
    lines = _random_lines(200, seed=1)
    tsv = [line + b"\t" + line.upper() for line in lines]
    path = tmp_path / "train.tsv"
    path.write_bytes(b"\n".join(tsv) + (b"\n" if trailing_newline else b""))
    ranges = units._byte_ranges(path)
    data = path.read_bytes()
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data) and len(ranges) > 20
    assert all(a < b and data[a - 1 : a] == b"\n" for a, b in ranges[1:])  # every unit starts a line
    assert all(b1 == a2 for (_, b1), (a2, _) in zip(ranges, ranges[1:], strict=False))
    total, rows, sizes = _read_units(Source("tsv", (path,), str(path)), DataConfig())
    assert total == len(ranges) and sum(sizes) == 200
    assert rows == [(line.decode(), line.decode().upper()) for line in lines]


@pytest.mark.parametrize("n", [1, 3, 7, 9, 10])
def test_plain_blocks_start_at_the_right_line_in_both_files(tmp_path, monkeypatch, n):
    monkeypatch.setattr(units, "UNIT_LINES", 3)
    zh, en = _random_lines(n, seed=2), _random_lines(n, seed=3)
    (tmp_path / "t.zh").write_bytes(b"\n".join(zh) + b"\n")
    (tmp_path / "t.en").write_bytes(b"\n".join(en))  # no final newline on one side
    source = Source("plain", (tmp_path / "t.zh", tmp_path / "t.en"), "t")
    total, rows, sizes = _read_units(source, DataConfig())
    assert total == -(-n // 3) and sizes == [3] * (n // 3) + ([n % 3] if n % 3 else [])
    assert rows == [(a.decode(), b.decode()) for a, b in zip(zh, en, strict=True)]


def test_line_starts_match_a_line_by_line_count(tmp_path):
    lines = _random_lines(5000, seed=4)
    path = tmp_path / "f"
    path.write_bytes(b"\n".join(lines) + b"\n")
    count, starts = units._line_starts(path, 7)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    assert count == 5000 and starts == offsets[:-1][::7]


def test_compressed_and_plain_units_read_like_the_whole_file(tmp_path, monkeypatch):
    import gzip

    monkeypatch.setattr(units, "UNIT_LINES", 4)
    zh, en = _random_lines(10, seed=5), _random_lines(10, seed=6)
    for name, lines in (("t.zh.gz", zh), ("t.en.gz", en)):
        (tmp_path / name).write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    source = Source("plain", (tmp_path / "t.zh.gz", tmp_path / "t.en.gz"), "t")
    total, rows, sizes = _read_units(source, DataConfig())
    assert total is None and sizes == [4, 4, 2]  # streamed: the count is not known before reading
    assert rows == [(a.decode(), b.decode()) for a, b in zip(zh, en, strict=True)]


@pytest.mark.parametrize("suffix", ["", ".xz"])
def test_differing_plain_files_are_one_error_naming_both(tmp_path, suffix):
    import lzma

    pack = lzma.compress if suffix else bytes
    (tmp_path / f"t.zh{suffix}").write_bytes(pack(b"a\nb\nc\n"))
    (tmp_path / f"t.en{suffix}").write_bytes(pack(b"a\nb\n"))
    source = Source("plain", (tmp_path / f"t.zh{suffix}", tmp_path / f"t.en{suffix}"), "t")
    with pytest.raises(NmtError, match=rf"t\.zh{suffix} has 3 lines but .*t\.en{suffix} has 2: parallel files must"):
        _, planned = units.plan_units(source, RECIPES["tatoeba"], DataConfig(), BadLines("x"))
        list(planned)
