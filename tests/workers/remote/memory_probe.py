"""`python -m tests.workers.remote.memory_probe --mode imports|client ...`: print its PSS.

`imports` only imports what a client imports; `client` also builds the remote model with a LoRA
adapter and runs a training step, so the difference is what the model itself costs.
"""

from __future__ import annotations

import argparse
import json
import sys

import psutil
import torch
from peft import LoraConfig, get_peft_model

from workers.remote import remote_model


def pss() -> int:
    return psutil.Process().memory_full_info().pss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["imports", "client"], required=True)
    parser.add_argument("--endpoint")
    parser.add_argument("--model")
    args = parser.parse_args()
    result: dict[str, float] = {}
    if args.mode == "client":
        model = remote_model(args.model, args.endpoint, client_name="probe")
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        result["local_bytes"] = sum(
            p.untyped_storage().nbytes() for p in model.parameters()) + sum(
            b.untyped_storage().nbytes() for b in model.buffers())
        result["pss_built"] = pss()
        model.train()
        ids = torch.randint(0, 50000, (1, 64))
        model(input_ids=ids, labels=ids).loss.backward()
    result["pss"] = pss()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
