"""`python -m workers.demo`: start an executor and run two tenants' adapters against it.

The main job until the HTTP gateway exists: one executor process holds the base weights; two
remote models (LoRA and IA3) train a few steps and generate, sharing it.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time

import torch
from peft import IA3Config, LoraConfig, TaskType, get_peft_model
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from workers.remote.build import remote_model

log = logging.getLogger("demo")


def start_executor(model: str, endpoint: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "executor", "--model", model, "--bind",
                             endpoint], stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        sys.stderr.write(line)
        if "executor ready" in line:
            return proc
    raise RuntimeError("executor exited before it was ready")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workers.demo")
    parser.add_argument("--model", default="tiny-llama")
    args = parser.parse_args(argv)
    endpoint = f"ipc://{tempfile.mkdtemp(prefix='symb-')}/executor.sock"
    executor = start_executor(args.model, endpoint)
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
        tenants = {
            "lora": get_peft_model(remote_model(args.model, endpoint, client_name="tenant-a"),
                                   LoraConfig(task_type=TaskType.CAUSAL_LM, r=8,
                                              target_modules="all-linear")),
            "ia3": get_peft_model(remote_model(args.model, endpoint, client_name="tenant-b"),
                                  IA3Config(task_type=TaskType.CAUSAL_LM,
                                            target_modules=["k_proj", "v_proj", "down_proj"],
                                            feedforward_modules=["down_proj"])),
        }
        ids = tokenizer("The shared executor holds the base weights.", return_tensors="pt")
        for name, model in tenants.items():
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                          lr=1e-2)
            model.train()
            started = time.perf_counter()
            for step in range(5):
                loss = model(**ids, labels=ids["input_ids"]).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                log.info("%s step %d loss %.4f", name, step + 1, loss.item())
            model.eval()
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=12, do_sample=False)
            text = tokenizer.decode(out[0, ids["input_ids"].shape[1]:])
            log.info("%s: 5 steps in %.2f s, generated %r", name, time.perf_counter() - started,
                     text)
        stats = tenants["lora"].base_model.model.symbiosis_executor.stats()
        log.info("executor stats: %s", stats[:200])
    finally:
        executor.terminate()
        executor.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(os.sys.argv[1:]))
