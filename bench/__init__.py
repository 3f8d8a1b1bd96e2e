"""Benchmarks: Symbiosis against plain transformers + peft, side by side, as ratios."""

from bench.sides import set_openmp

set_openmp()  # every bench process imports this first, before torch loads (`bench.sides`)
