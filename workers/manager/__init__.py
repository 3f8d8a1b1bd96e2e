"""The worker manager process (torch-free): a broker between the gateway and the inference
workers (`broker`), its bookkeeping (`pool`), the fine-tuning queue (`jobs`), the client of the
preloaded spawner (`spawner_client`) and of the executor's liveness (`executor_probe`).
"""
