"""Where diagnose results go: every table as Parquet and CSV, every figure as PNG (or SVG) beside it,
all written atomically so an interrupted run never leaves half a file."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from promptopt.yamlio import atomic_write_bytes_via

V_EFF_BANDS = ("<20", "20–100", ">100")  # the δ_TCB paper's Table 2 categories


def v_eff_band(v_eff) -> pd.Series:
    """The paper's V_eff categories: < 20, 20–100, > 100."""
    return pd.Series(
        pd.cut(
            pd.Series(v_eff, dtype=float), [0.0, 20.0, 100.0, float("inf")], right=False, labels=list(V_EFF_BANDS)
        ).astype(str)
    )


def new_figure(ncols: int = 1, nrows: int = 1, *, size: tuple[float, float] | None = None):
    """A matplotlib figure on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, ncols, figsize=size or (5.0 * ncols, 4.0 * nrows), squeeze=False)


def save_figure(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    fig.tight_layout()
    atomic_write_bytes_via(path, lambda p: fig.savefig(p, format=path.suffix.lstrip(".") or "png", dpi=120))
    plt.close(fig)
    return path
