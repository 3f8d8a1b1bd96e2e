"""A client process for multi-process tests: `python -m tests.workers.train_client ...`.

Trains one adapter through the executor at ENDPOINT and, beside it, the same adapter on plain
transformers + peft; prints the comparison as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys

from tests.peft_reference import compare
from workers import ExecutorClient


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--method", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    client = ExecutorClient(args.endpoint, name=f"train-{args.method}")
    try:
        result = compare(args.model, args.method, client, steps=args.steps, seed=args.seed)
    finally:
        client.close()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
