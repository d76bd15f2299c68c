"""`nmt export`: the one entry for every export format of a run's checkpoint.

- ``ctranslate2``: a CTranslate2 model directory (`nmt.decode.ct2_export`), also the engine's cache;
- ``argos``: an Argos Translate package around that export (`nmt.decode.argos`).

The dispatch lives here, above both, so that neither format's module imports the other.
"""

from __future__ import annotations

from pathlib import Path

from nmt.decode.argos import export_argos
from nmt.decode.ct2_export import EXPORT_FORMATS, ExportOptions, export_run
from nmt.errors import NmtError


def export(opts: ExportOptions) -> Path:
    """Write (or reuse) the export of `opts.format`; returns its path."""
    if opts.format not in EXPORT_FORMATS:
        raise NmtError(f"--format {opts.format!r}: expected one of {' | '.join(EXPORT_FORMATS)}")
    return export_argos(opts) if opts.format == "argos" else export_run(opts)
