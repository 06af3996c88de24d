"""Views of a partition for `rayfl partition`: a text client x class table and a chart in the
style of ZO-HFL's Fig. 1. The chart uses a bare Agg Figure, never pyplot, so it works headless
and leaves any global matplotlib backend alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rayfl.data.federated import FederatedDataset

MAX_ROWS = 40
BUBBLE_MAX_CLIENTS = 100


def format_class_matrix(fd: FederatedDataset, split: str = "train", max_rows: int = MAX_ROWS) -> str:
    """A compact table: one row per client (size and per-class counts), the middle rows
    elided past `max_rows` clients, then the server's row (if any) and the totals."""
    counts = fd.class_matrix(split)
    sizes = counts.sum(axis=1)
    rows: list[list[str]] = []
    m = fd.num_clients
    shown = range(m) if m <= max_rows else [*range(max_rows // 2), -1, *range(m - max_rows // 2, m)]
    for k in shown:
        if k < 0:
            rows.append([f"... {m - 2 * (max_rows // 2)} more clients ..."])
            continue
        rows.append([str(k), str(sizes[k]), *map(str, counts[k])])
    if split == "train" and fd.server_train is not None:
        srv = np.bincount(fd.train_y[fd.server_train], minlength=fd.num_classes)
        rows.append(["server", str(srv.sum()), *map(str, srv)])
    total = counts.sum(axis=0)
    rows.append(["total", str(total.sum()), *map(str, total)])
    header = ["client", "size", *(str(c) for c in range(fd.num_classes))]
    widths = [max(len(r[i]) for r in [header, *rows] if len(r) > 1) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        if len(cells) == 1:
            return cells[0]
        return "  ".join(cell.rjust(w) for cell, w in zip(cells, widths, strict=True))

    return "\n".join(line(r) for r in [header, *rows])


def plot_partition(fd: FederatedDataset, path: str | Path, split: str = "train") -> Path:
    """Save a chart of the client x class counts: bubbles (area ~ count) for up to 100
    clients, stacked bars beyond that. Returns the path written."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = fd.class_matrix(split)
    m, c = counts.shape
    fig = Figure(figsize=(min(max(4.0, 0.35 * m + 2), 16.0), max(3.0, 0.35 * c + 1.5)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if m <= BUBBLE_MAX_CLIENTS:
        kk, cc = np.nonzero(counts)
        area = counts[kk, cc] / max(counts.max(), 1) * 400.0
        ax.scatter(kk, cc, s=area, color="tab:red", alpha=0.7, linewidths=0)
        ax.set_yticks(range(c))
        ax.set_ylabel("class")
        ax.set_xlim(-0.7, m - 0.3)
        ax.set_ylim(-0.7, c - 0.3)
        if m <= 40:
            ax.set_xticks(range(m))
    else:
        bottom = np.zeros(m)
        cmap = colormaps["tab20" if c > 10 else "tab10"]
        for j in range(c):
            ax.bar(np.arange(m), counts[:, j], bottom=bottom, width=1.0, linewidth=0, color=cmap(j % cmap.N), label=str(j))
            bottom += counts[:, j]
        ax.set_ylabel("samples")
        if c <= 20:
            ax.legend(title="class", fontsize="small", ncols=2, loc="upper right")
    ax.set_xlabel("client")
    ax.set_title(f"{fd.name}: {split} samples per client and class")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    return out
