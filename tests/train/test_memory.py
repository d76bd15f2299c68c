"""nmt.train.memory: anonymous and file-backed resident memory read apart, and their peaks."""

from __future__ import annotations

import mmap
import sys

import pytest

from nmt.train.memory import ResidentMemory, resident_bytes

STATUS = "Name:\tpython\nVmRSS:\t  {rss} kB\nRssAnon:\t  {anon} kB\nRssFile:\t  {file} kB\nRssShmem:\t 0 kB\n"


def test_the_two_kinds_are_read_apart_and_their_peaks_kept(tmp_path):
    status = tmp_path / "status"
    memory = ResidentMemory(status)
    for anon, file in ((1024, 4096), (3072, 2048), (2048, 1024)):
        status.write_text(STATUS.format(rss=anon + file, anon=anon, file=file))
        assert resident_bytes(status) == (anon * 1024, file * 1024)
        memory.sample()
    assert (memory.peak_anon, memory.peak_file) == (3 << 20, 4 << 20)  # each its own peak
    assert memory.describe() == "memory: peak resident 3 MiB anonymous, 4 MiB file-backed (sampled at log points)"


def test_without_proc_there_is_no_line(tmp_path):
    memory = ResidentMemory(tmp_path / "absent")
    memory.sample()
    assert resident_bytes(tmp_path / "absent") is None and memory.describe() is None
    (tmp_path / "other").write_text("Name:\tpython\n")
    assert resident_bytes(tmp_path / "other") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux's")
def test_an_allocation_shows_as_anonymous_memory():
    """Fresh pages from the kernel (an anonymous mapping, every page written), not heap memory that
    the allocator may already hold resident from an earlier test."""
    before = resident_bytes()
    block = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # not shared: RssShmem
    for page in range(0, len(block), mmap.PAGESIZE):
        block[page] = 1
    after = resident_bytes()
    block.close()
    assert before is not None and after is not None and after[0] - before[0] > 48 << 20
