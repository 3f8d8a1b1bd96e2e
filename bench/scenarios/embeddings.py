"""Embeddings (19): inputs of 8 LoRA adapters (r8), each through its own, in one worker's engine
on the run's executor (the real classes, `workers/inference/embedding.py`: a step's 2,048 tokens,
similar lengths in one forward, the decoder alone) against one plain peft process holding the 8
adapters, which embeds a round's inputs in one forward, each row through its adapter
(`adapter_names`, peft's mixed batch), left-padded, and reads the last hidden state
(`output_hidden_states`, the head's logits at the last position only). Rounds in turn, the best
of each side; both sides' vectors are compared first. Ours' worker part runs in this process on
a worker's threads, the executor and the peft process on the run's (as scenario 13's rows)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

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
                   best["ours"], best["plain"], "inputs/s")]


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
