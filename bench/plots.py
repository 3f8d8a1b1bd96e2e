"""PNG plots of the scaling curves."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def throughput(curves: dict, path: Path) -> Path:
    """curves: {regime: {n_jobs: (ours tok/s, baseline tok/s)}}."""
    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.6), squeeze=False)
    for ax, (regime, points) in zip(axes[0], curves.items(), strict=True):
        ns = sorted(points)
        ax.plot(ns, [points[n][0] for n in ns], "o-", label="Symbiosis (shared executor)")
        ax.plot(ns, [points[n][1] for n in ns], "s--", label="N x transformers + peft")
        ax.set_title(f"Fine-tuning, {regime}")
        ax.set_xlabel("concurrent jobs")
        ax.set_ylabel("training tokens/s (all jobs)")
        ax.set_xticks(ns)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
