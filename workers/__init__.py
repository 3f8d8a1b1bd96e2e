"""The tenant side: `remote/` (a model whose frozen layers run in the shared executor), and the
processes built on it: the worker `manager/` (torch-free), the `spawner` that forks workers and
trainers from a preloaded parent, `inference/` workers and `training/` trainers.

Nothing here is imported by this package itself, so the torch-free manager stays torch-free.
"""
