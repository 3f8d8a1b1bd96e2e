"""Persistent state in SQLite (WAL) under the data dir: adapters, files, fine-tuning jobs.

Torch-free; shared by the gateway, the worker manager and trainer processes.
"""
