"""The one exception type for user mistakes.

Anything raised as `NmtError` is printed by the CLI as a single line on stderr with a
non-zero exit; anything else is a bug and keeps its traceback.
"""


class NmtError(Exception):
    """A user-facing error: bad input, bad config, missing files. Message is one line."""


class ConfigError(NmtError):
    """A config file or override that cannot be used."""
