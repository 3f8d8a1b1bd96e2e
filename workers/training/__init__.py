"""Trainer processes: one per running fine-tuning job, on the shared executor."""
