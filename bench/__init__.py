"""Benchmarks: Symbiosis against plain transformers + peft, side by side, as ratios."""
