"""The training process's resident memory, anonymous and file-backed apart (Linux `/proc`).

Why apart: pages of a memory-mapped file that the process has touched count in its resident
size (RssFile) although the kernel may drop them at will, while anonymous memory (RssAnon: arrays,
the model, the optimizer) is what the process really holds. A trainer whose anonymous memory is
flat while the corpus grows does not leak; file-backed memory that grows says a file is mapped
and read through. `ResidentMemory` keeps the peak of each as sampled (at the loop's settle points).
"""

from __future__ import annotations

from pathlib import Path

STATUS = Path("/proc/self/status")
MIB = 1 << 20


def resident_bytes(status: Path = STATUS) -> tuple[int, int] | None:
    """(anonymous, file-backed) resident bytes of this process now; None where /proc has no such
    lines (not Linux)."""
    try:
        text = status.read_text()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024  # reported in kB
    if len(fields) < 2:
        return None
    return fields["RssAnon"], fields["RssFile"]


class ResidentMemory:
    """The peaks of anonymous and file-backed resident memory over the samples taken."""

    def __init__(self, status: Path = STATUS) -> None:
        self.status = status
        self.peak_anon = self.peak_file = 0
        self.known = False

    def sample(self) -> None:
        now = resident_bytes(self.status)
        if now is not None:
            self.known = True
            self.peak_anon, self.peak_file = max(self.peak_anon, now[0]), max(self.peak_file, now[1])

    def describe(self) -> str | None:
        """The train.log line of the peaks (None without a sample)."""
        if not self.known:
            return None
        return (
            f"memory: peak resident {self.peak_anon / MIB:.0f} MiB anonymous, "
            f"{self.peak_file / MIB:.0f} MiB file-backed (sampled at log points)"
        )
