"""A client process for multi-process tests: `python -m tests.workers.remote.client_process ...`.

Runs one workload through the executor at ENDPOINT and the same on plain transformers + peft,
and prints the largest differences as JSON:
- train: forward, backward, AdamW steps, then greedy generation (tests.peft_reference.compare)
- decode: greedy generation of several prompts
- prefill: forward passes over longer sequences in the executor's dtype, no gradient
- flood: one large call after another on a fused layer until STOP_FILE exists (no reference)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from tests.peft_reference import build_pair, compare, low_precision_errors
from wire.call.messages import CallKind, LayerKind, Op
from workers.remote.client import ExecutorClient


def decode(model: str, method: str, client: ExecutorClient, seed: int, rounds: int) -> dict:
    plain, ours = build_pair(model, method, client, seed)
    equal = True
    for i in range(rounds):
        ids = torch.randint(0, 50257, (1, 5 + i), generator=torch.Generator().manual_seed(seed + i))
        with torch.no_grad():
            a = plain.generate(input_ids=ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
            b = ours.generate(input_ids=ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)
        equal &= torch.equal(a, b)
    return {"generate_equal": bool(equal)}


def prefill(model: str, method: str, client: ExecutorClient, seed: int, rounds: int,
            device: str = "cpu") -> dict:
    """Forward passes of ours and plain in the executor's dtype, each against plain float32
    (tests.peft_reference.low_precision_errors)."""
    return low_precision_errors(model, method, client, seed, rounds, device)


def flood(client: ExecutorClient, stop_file: Path) -> dict:
    group = next(s for s in client.layers if s.kind == LayerKind.GROUP)
    x = torch.randn(4096, group.in_features, device=client.client_device)
    calls = 0
    while not stop_file.exists():
        client.call(Op.FORWARD, group.index, x, CallKind.TRAINING)
        calls += 1
    return {"calls": calls}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--workload", choices=["train", "decode", "prefill", "flood"],
                        default="train")
    parser.add_argument("--method", default="lora")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--stop-file", type=Path)
    parser.add_argument("--device", default="cpu", help="where this client's tensors live")
    args = parser.parse_args()
    client = ExecutorClient(args.endpoint, name=f"{args.workload}-{args.method}-{args.seed}",
                            device=args.device)
    try:
        if args.workload == "train":
            result = compare(args.model, args.method, client, steps=args.steps, seed=args.seed,
                             device=args.device)
        elif args.workload == "decode":
            result = decode(args.model, args.method, client, args.seed, args.steps)
        elif args.workload == "prefill":
            result = prefill(args.model, args.method, client, args.seed, args.steps,
                             args.device)
        else:
            result = flood(client, args.stop_file)
    finally:
        client.close()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
