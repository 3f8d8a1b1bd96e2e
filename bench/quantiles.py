"""Quantiles of latencies, one estimator for the whole bench: linear interpolation between the
two nearest ranks (Hyndman and Fan's type 7, numpy's and `statistics.quantiles(method=
"inclusive")`'s). By nearest rank, a p99 of 100 samples or fewer was their largest and one of
101 to 200 their second largest, so two sides with unlike counts of first tokens compared
unlike ranks (bench/NOTES.md); interpolated, a quantile moves smoothly with the count."""

from __future__ import annotations

import math


def quantile_ms(values: list[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) of sorted seconds `values`, in ms; NaN when there are
    none."""
    if not values:
        return float("nan")
    at = (len(values) - 1) * q
    low = math.floor(at)
    high = min(low + 1, len(values) - 1)
    return 1e3 * (values[low] + (at - low) * (values[high] - values[low]))
