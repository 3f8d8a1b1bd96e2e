"""The formats of every link between processes, imported by both ends of each; imports nothing
else of the project. `executor`: worker <-> executor messages; `manager`: gateway <-> worker
manager <-> workers (torch-free); `tensors`: tensors as raw bytes; `shm`: shared-memory segments;
`doorbell`: the same-host fast path.
"""
