"""The data plane's one format, worker <-> executor, used by both ends: `messages` (layers,
calls, replies), `header` (the fixed binary header in front of a call's tensors), `tensors`
(tensors as raw bytes), `shm` (shared-memory segments), `pinning` (page-locked host memory for
an executor on a GPU), `cuda_ipc` (device buffers shared across processes), `device` (the thin
layer that differs between a CPU and a GPU), `doorbell` and `spin` (the same-host fast path).
The worker's side is `workers.remote`, the executor's is `executor`.
"""
