"""The data dir's records in SQLite (WAL): files, adapters and their versions, fine-tuning jobs.

Torch-free. Read here by the gateway, the worker manager and trainers; written only by the worker
manager (`workers/manager/*_store.py`), which the others ask by typed messages (`wire.store`,
`wire.jobs`).
"""
