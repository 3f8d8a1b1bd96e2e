"""The shared executor: one process owning the frozen base weights, serving many workers."""

import os

# Spinning OpenMP threads in several processes fight for the cores; set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
