"""Reports: the study's figures and more, as a self-contained HTML page plus PNG/SVG/PDF files.

``build_report(path, out)`` takes a run directory or a sweep folder (see :mod:`powertrain.analyze`).
"""

from powertrain.report.build import build_report

__all__ = ["build_report"]
