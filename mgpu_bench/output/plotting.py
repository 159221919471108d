"""matplotlib for the reports: the Agg backend (no display, imported only when a report is
written), figures to PNG bytes, outside text made safe for matplotlib's mathtext."""

from __future__ import annotations

import io


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(plt, fig) -> bytes:
    """The figure as PNG bytes (tight bounding box, 100 dpi); the figure is closed."""
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        return buf.getvalue()
    finally:
        plt.close(fig)


def plain(text: object) -> str:
    """An outside string (a backend, a host, a model or GPU name) as plain matplotlib text, for a
    title, a label, a legend entry or a tick: a `$` pair would start mathtext, which draws what it
    parses and refuses what it cannot (the whole report then fails), so each `$` is escaped;
    control characters are shown as their escapes (console.safe_text)."""
    from .console import safe_text

    return safe_text(text, lines=True).replace("$", r"\$")
