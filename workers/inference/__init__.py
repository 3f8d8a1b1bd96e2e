"""Inference workers: continuous batching over one tenant adapter's requests."""
