"""One load-generating client: a remote model with its own adapter, running one workload.

`python -m bench.workload --endpoint E --model M --kind decode|prefill|train ...` builds its
model, prints "ready", waits for a line on stdin (the start signal, sent to all clients at once),
runs for the duration and prints its measurements as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from peft import IA3Config, LoraConfig, PrefixTuningConfig, PromptTuningConfig, get_peft_model

from workers import remote_model


def adapter(method: str, rank: int):
    if method == "lora":
        return LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj",
                                                                       "v_proj", "o_proj"])
    if method == "ia3":
        return IA3Config(target_modules=["k_proj", "v_proj", "down_proj"],
                         feedforward_modules=["down_proj"])
    if method == "prefix_tuning":
        return PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=8)
    if method == "prompt_tuning":
        return PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=8)
    raise ValueError(method)


def decode(model, prompt: int, tokens: int, until: float, rng: torch.Generator) -> list[float]:
    latencies = []
    while time.monotonic() < until:
        ids = torch.randint(0, 50000, (1, prompt), generator=rng)
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True)
            past = out.past_key_values
            token = out.logits[:, -1:].argmax(-1)
            for _ in range(tokens):
                started = time.perf_counter()
                out = model(input_ids=token, past_key_values=past, use_cache=True)
                past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
                latencies.append(time.perf_counter() - started)
                if time.monotonic() >= until:
                    break
    return latencies


def prefill(model, length: int, until: float, rng: torch.Generator) -> list[float]:
    latencies = []
    while time.monotonic() < until:
        ids = torch.randint(0, 50000, (1, length), generator=rng)
        started = time.perf_counter()
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        latencies.append(time.perf_counter() - started)
    return latencies


def train(model, batch: int, length: int, until: float, rng: torch.Generator) -> list[float]:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    latencies = []
    while time.monotonic() < until:
        ids = torch.randint(0, 50000, (batch, length), generator=rng)
        started = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        latencies.append(time.perf_counter() - started)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--kind", choices=["decode", "prefill", "train"], required=True)
    parser.add_argument("--method", default="lora")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = get_peft_model(remote_model(args.model, args.endpoint,
                                        client_name=f"{args.kind}-{args.seed}"),
                           adapter(args.method, args.rank))
    model.eval()
    rng = torch.Generator().manual_seed(args.seed)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    until = time.monotonic() + args.duration
    if args.kind == "decode":
        latencies, per_unit = decode(model, args.prompt, args.tokens, until, rng), 1
    elif args.kind == "prefill":
        latencies, per_unit = prefill(model, args.length, until, rng), args.length
    else:
        latencies, per_unit = train(model, args.batch, args.length, until, rng), \
            args.batch * args.length
    sys.stdout.write(json.dumps({"kind": args.kind, "method": args.method, "rank": args.rank,
                                 "latencies": latencies, "tokens_per_unit": per_unit,
                                 "duration": args.duration}) + "\n")


if __name__ == "__main__":
    main()
