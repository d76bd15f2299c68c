"""`nmt export`: the one entry for every export format of a run's checkpoint.

- ``ctranslate2``: a CTranslate2 model directory (`nmt.export.ct2_model`), also the engine's cache;
- ``argos``: an Argos Translate package around that export (`nmt.export.argos`).

The dispatch lives here, above both, so that neither format's module imports the other.
"""

from __future__ import annotations

from pathlib import Path

from nmt.errors import NmtError
from nmt.export.argos import export_argos
from nmt.export.ct2_model import EXPORT_FORMATS, ExportOptions, export_run


def export(opts: ExportOptions) -> Path:
    """Write (or reuse) the export of `opts.format`; returns its path."""
    if opts.format not in EXPORT_FORMATS:
        raise NmtError(f"--format {opts.format!r}: expected one of {' | '.join(EXPORT_FORMATS)}")
    return export_argos(opts) if opts.format == "argos" else export_run(opts)
