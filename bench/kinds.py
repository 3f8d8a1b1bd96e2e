"""The benchmark client's kinds of work (`python -m bench.workload --kind`), for the client and
the scenarios that start it."""

INFERENCE_KINDS = ("decode", "prefill", "long", "beside", "lengths", "calls")
TRAINING_KINDS = ("train", "chat", "dpo")  # chat's and dpo's `length`: about their tokens
KINDS = INFERENCE_KINDS + TRAINING_KINDS
