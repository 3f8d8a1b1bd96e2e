"""The formats of every link between processes, imported by both ends of each; imports nothing
else of the project. `call`: the data plane, worker <-> executor (messages, the binary call
header, shared memory, doorbells, device buffers); `manager`: gateway <-> worker manager <->
workers (torch-free); `jobs`: fine-tuning jobs' commands and trainers' reports; `spawner`: what
the manager asks the spawner to fork.
"""
