"""The bench's one quantile estimator: interpolated between the nearest ranks, as Python's
`statistics.quantiles(method="inclusive")` computes it, so that sides with unlike sample
counts compare like quantiles."""

import math
import random
import statistics

import pytest

from bench.quantiles import quantile_ms


@pytest.mark.parametrize("count", [2, 7, 80, 100, 101, 250])
def test_each_percentile_is_the_standard_libraries_inclusive_one(count: int) -> None:
    rng = random.Random(count)
    values = sorted(rng.lognormvariate(-3, 1) for _ in range(count))
    reference = statistics.quantiles(values, n=100, method="inclusive")
    for k in range(1, 100):
        assert quantile_ms(values, k / 100) == pytest.approx(1e3 * reference[k - 1])


def test_the_ends_are_the_shortest_and_the_longest() -> None:
    values = [0.1, 0.2, 0.4]
    assert quantile_ms(values, 0.0) == pytest.approx(100.0)
    assert quantile_ms(values, 1.0) == pytest.approx(400.0)
    assert quantile_ms([0.25], 0.99) == pytest.approx(250.0)
    assert math.isnan(quantile_ms([], 0.5))


def test_one_slow_sample_of_91_weighs_a_tenth_of_its_gap_not_all_of_it() -> None:
    """By nearest rank, a p99 of 100 samples or fewer was their largest: one slow first token
    made it. Interpolated, it lies 0.1 of the way from the second largest of 91 to the largest
    (of 101, at the second largest)."""
    values = [0.1 + 0.001 * i for i in range(90)] + [5.0]
    assert quantile_ms(values, 0.99) == pytest.approx(1e3 * (0.189 + 0.1 * (5.0 - 0.189)))
    of_101 = [0.1 + 0.001 * i for i in range(100)] + [5.0]
    assert quantile_ms(of_101, 0.99) == pytest.approx(199.0)
