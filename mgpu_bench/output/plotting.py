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
    """An outside string as plain matplotlib text: a `$` pair would start mathtext."""
    return str(text).replace("$", r"\$")
