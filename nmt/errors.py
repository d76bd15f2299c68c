"""What the library tells a user about a problem: the one exception type for user mistakes,
and the one way to warn.

Anything raised as `NmtError` is printed by the CLI as a single line on stderr with a
non-zero exit; anything else is a bug and keeps its traceback. A problem that does not stop the
work (bad lines skipped, a split missing, a slow precision) is `warn`ed: one line on stderr,
`warning: <message>`, never Python's warning format (no source file and line of nmt's code).
"""

from __future__ import annotations

import functools
import sys


class NmtError(Exception):
    """A user-facing error: bad input, bad config, missing files. Message is one line."""


class ConfigError(NmtError):
    """A config file or override that cannot be used."""


def warn(message: str) -> None:
    """`warning: <message>` on stderr, one line."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


@functools.lru_cache(maxsize=64)
def warn_once(message: str) -> None:
    """`warn`, once per process for the same message (a warning repeated per batch is noise)."""
    warn(message)
