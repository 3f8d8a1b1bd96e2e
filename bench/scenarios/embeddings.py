"""Embeddings (19): inputs of 8 LoRA adapters (r8), each through its own, in one worker's engine
on the run's executor (the real classes, `workers/inference/embedding.py`: a step's 2,048 tokens,
similar lengths in one forward, the decoder alone) against one plain peft process holding the 8
adapters, which embeds a round's inputs in one forward, each row through its adapter
(`adapter_names`, peft's mixed batch), left-padded, and reads the last hidden state
(`output_hidden_states`, the head's logits at the last position only). Rounds in turn, the best
of each side; both sides' vectors are compared first. Ours' worker part runs in this process on
a worker's threads, the executor and the peft process on the run's (as scenario 13's rows).

Its second row is what a user pays: one request of many inputs to one LoRA adapter through the
whole stack at its default settings (the executor on the run's threads), the official SDK's
`embeddings.create` (base64, as it asks by default), against the plain peft process embedding
the same inputs through the same adapter in one forward."""

from __future__ import annotations

import base64
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

from bench.peft_process import PeftProcess
from bench.records import Record
from bench.scenarios.adapter_sides import MODEL, Ours, make_adapters
from bench.scenarios.common import Settings, worker_threads
from catalogue.resolve import resolve_model
from wire import manager as W

ADAPTERS = 8
ROUNDS = 3


def inputs(count: int, length: int, vocab: int) -> list[list[int]]:
    """`count` seeded inputs of `length` tokens, a quarter of them up to 3 tokens shorter (as
    texts differ)."""
    generator = torch.Generator().manual_seed(0)
    shorter = [k % 3 + 1 if k % 4 == 3 else 0 for k in range(count)]
    return [torch.randint(3, vocab, (length - short,), generator=generator).tolist()
            for short in shorter]


def embeddings(settings: Settings) -> list[Record]:
    torch.set_num_threads(worker_threads(settings))  # ours' worker part; plain's get the run's
    count, length = (8, 8) if settings.toy else (64, 32)
    executor = settings.executors.get(MODEL, policy="opportunistic", threads=settings.threads,
                                      dtype=settings.dtype, device=settings.device)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    prompts = inputs(count, length, tokenizer.vocab_size)
    which = [k % ADAPTERS for k in range(count)]
    root = Path(tempfile.mkdtemp(prefix="symb-embeddings-"))
    try:
        paths = make_adapters(root, ADAPTERS)
        ours = Ours(executor.endpoint, tokenizer)
        mine = embed_round(ours, paths, prompts, which)[1]  # the adapters loaded: not timed
        best = {"ours": 0.0, "plain": 0.0}
        with PeftProcess(resolve_model(MODEL), paths, [], 0, settings.threads, mixed=True,
                         embed={"prompts": prompts, "adapters": which}) as plain:
            theirs = plain.generate()[1]  # its first round: not timed
            gap = (torch.tensor(mine) - torch.tensor(theirs)).abs().max().item()
            if gap > 1e-4:
                raise AssertionError(f"the sides' embeddings differ by {gap}")
            for _ in range(ROUNDS):
                best["ours"] = max(best["ours"], count / embed_round(ours, paths, prompts,
                                                                     which)[0])
                best["plain"] = max(best["plain"], count / plain.round())
    finally:
        shutil.rmtree(root, ignore_errors=True)
        torch.set_num_threads(settings.threads)  # the run's, for the scenarios after this one
    return [Record("19 embeddings", f"{count} inputs of ~{length} tokens over {ADAPTERS} LoRA "
                   "adapters: inputs/s vs one peft process (adapter_names, one forward)",
                   best["ours"], best["plain"], "inputs/s"), through_the_api(settings)]


def through_the_api(settings: Settings) -> Record:
    """One request of `count` inputs to one adapter through the whole stack (the SDK's call
    timed) against the plain peft process's forward of them: the best of `ROUNDS` in turn."""
    import openai

    from bench.scenarios.tenants import register
    from launcher.ports import free_port
    from launcher.stack import Stack

    count, length = (16, 8) if settings.toy else (512, 32)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    prompts = inputs(count, length, tokenizer.vocab_size)
    root = Path(tempfile.mkdtemp(prefix="symb-embeddings-api-"))
    best = {"ours": 0.0, "plain": 0.0}
    try:
        paths = make_adapters(root / "files", 1)
        (model,) = register(root / "data", paths, 1)
        stack = Stack(root / "data", MODEL, port=free_port(),
                      env={"SYMBIOSIS_API_KEYS": "t0=sk-t0"},
                      executor_args=("--threads", str(settings.threads))).start()
        try:
            client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="sk-t0",
                                   max_retries=0, timeout=600)
            with PeftProcess(resolve_model(MODEL), paths, [], 0, settings.threads, mixed=True,
                             embed={"prompts": prompts, "adapters": [0] * count}) as plain:
                mine = [vector(e.embedding) for e in client.embeddings.create(
                    model=model, input=prompts, encoding_format="base64").data]  # not timed
                gap = (torch.tensor(mine) - torch.tensor(plain.generate()[1])).abs().max().item()
                if gap > 1e-4:
                    raise AssertionError(f"the sides' embeddings differ by {gap}")
                for _ in range(ROUNDS):
                    started = time.perf_counter()
                    client.embeddings.create(model=model, input=prompts)
                    best["ours"] = max(best["ours"], count / (time.perf_counter() - started))
                    best["plain"] = max(best["plain"], count / plain.round())
        finally:
            stack.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return Record("19 embeddings", f"one request of {count} inputs of ~{length} tokens to a "
                  "LoRA adapter, the whole stack (official SDK) vs one peft process's forward",
                  best["ours"], best["plain"], "inputs/s")


def vector(embedding: list[float] | str) -> list[float]:
    """An embedding as the SDK hands it over: its floats (decoded where it is base64)."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4").tolist()
    return embedding


def embed_round(ours: Ours, paths: list[Path], prompts: list[list[int]],
                which: list[int]) -> tuple[float, list[list[float]]]:
    """Seconds of one round of ours (every input added, the engines stepped until each is
    answered), and the embeddings it made, in the inputs' order."""
    from workers.inference.request import Request

    started = time.perf_counter()
    for k, (prompt, adapter) in enumerate(zip(prompts, which, strict=True)):
        path = str(paths[adapter])
        engine, name = ours.adapters.route(path, W.AdapterRef(path, "LORA"))
        engine.add(Request(f"e{k}", prompt, W.SamplingParams(max_tokens=0, embed=True),
                           adapter=name))
    made: dict[str, bytes] = {}
    while len(made) < len(prompts):
        for engine in ours.adapters.engines():
            for event in engine.step() if engine.has_work() else []:
                if isinstance(event, W.Failed):
                    raise AssertionError(event)
                if isinstance(event, W.Done):
                    made[event.id] = event.embedding
    seconds = time.perf_counter() - started
    return seconds, [torch.frombuffer(bytearray(made[f"e{k}"]), dtype=torch.float32).tolist()
                     for k in range(len(prompts))]
