"""The CPU cores this process may use, without PyTorch (the CTranslate2 path of `nmt translate`
never imports it)."""

from __future__ import annotations

import os


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask; every core where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_threads(threads: int = 0) -> int:
    """Intra-op threads of a decoding engine: `threads`, else $OMP_NUM_THREADS (as PyTorch reads
    it), else every available core."""
    if threads > 0:
        return threads
    env = os.environ.get("OMP_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else available_cores()
