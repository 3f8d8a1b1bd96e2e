"""Per-call overhead (8) and worker cold start (from the serving issue)."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from bench.callpath import pipe_floor
from bench.executors import executor
from bench.models import FIXED_LENGTH
from bench.records import Record
from bench.scenarios.common import Settings, run_ours
from catalogue.resolve import resolve_model
from wire.call.messages import CallKind, Op

MODEL = "tiny-llama"  # small layers: the overhead, not the matmuls, is what is measured


def _generate_s(model, ids: torch.Tensor, tokens: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=tokens, **FIXED_LENGTH)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def per_call(settings: Settings) -> list[Record]:
    """Executor round trip of a 1-row call, and the overhead per call in a decode loop."""
    from workers.remote.build import remote_model
    from workers.remote.client import ExecutorClient
    torch.set_num_threads(1)
    with executor(MODEL, threads=1) as (endpoint, _):  # a private one: nothing else on it
        client = ExecutorClient(endpoint, name="overhead")
        layer = next(s for s in client.layers if s.name.endswith("layers.0.self_attn.o_proj"))
        x = torch.randn(1, layer.in_features)
        n = 50 if settings.toy else 500 if settings.quick else 2000
        for _ in range(50):
            client.call(Op.FORWARD, layer.index, x, CallKind.INFERENCE)
        started = time.perf_counter()
        for _ in range(n):
            client.call(Op.FORWARD, layer.index, x, CallKind.INFERENCE)
        rtt_us = (time.perf_counter() - started) / n * 1e6
        each = []
        for _ in range(n):
            begun = time.perf_counter()
            client.call(Op.FORWARD, layer.index, x, CallKind.INFERENCE)
            each.append(time.perf_counter() - begun)
        median_rtt_us, pipe_us = 1e6 * statistics.median(each), pipe_floor()
        weight = torch.randn(layer.out_features, layer.in_features)
        started = time.perf_counter()
        for _ in range(n):
            F.linear(x, weight)
        local_us = (time.perf_counter() - started) / n * 1e6
        model = remote_model(MODEL, client)
        plain = AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)).eval()
        ids = torch.randint(0, 50000, (1, 8))
        tokens, repeats = (4, 1) if settings.toy else (32, 9 if settings.quick else 21)
        _generate_s(model, ids, 2, 1)
        _generate_s(plain, ids, 2, 1)
        before = client.calls
        remote, local = [], []
        for _ in range(repeats):  # alternately, so that both see the same host
            remote.append(_generate_s(model, ids, tokens, 1))
            local.append(_generate_s(plain, ids, tokens, 1))
        calls_per_token = (client.calls - before) / repeats / tokens
        client.close()
    remote_s, local_s = statistics.median(remote), statistics.median(local)
    overhead_us = (remote_s - local_s) / tokens / calls_per_token * 1e6
    return [
        Record("8 per-call overhead", "round trip of a 1-row call vs a bare pipe round trip",
               median_rtt_us, pipe_us, "us", "<= 1.5x", higher_is_better=False,
               note="medians; the pipes: two processes, one byte each way (bench.callpath)"),
        Record("8 per-call overhead", "decode time per token vs the plain model in-process",
               1e3 * remote_s / tokens, 1e3 * local_s / tokens, "ms", "<= 1.2x",
               higher_is_better=False,
               note=f"greedy, {MODEL}, 1 thread each side, {tokens} tokens (no end-of-sequence "
                    f"stop, else generate's defaults); medians of "
                    f"{repeats} generations, alternately"),
        Record("8 per-call overhead", "round trip of a 1-row call", rtt_us, local_us, "us",
               "<= 100 us", higher_is_better=False, note="baseline: the same matmul locally"),
        Record("8 per-call overhead", "decode: (remote - local time per token) / calls per token",
               overhead_us, None, "us", "<= 150 us", higher_is_better=False,
               note=f"{calls_per_token:.0f} executor calls per token, {MODEL}; medians of "
                    f"{repeats} generations of {tokens} tokens, remote and local alternately"),
    ]


def executor_rate(settings: Settings) -> list[Record]:
    """32 clients each making 1-row calls back to back on one small layer: calls/s served."""
    n = settings.n(32)
    result = run_ours(settings, [{"kind": "calls", "duration": settings.duration}] * n,
                      model=MODEL)
    return [Record("10 executor throughput", f"{n} single-row clients, calls/s",
                   result.tokens_per_s(), None, "calls/s", ">= 30000",
                   note=f"{MODEL}, o_proj; median round trip {result.latency_ms(0.5):.2f} ms")]


def cold_start(settings: Settings) -> list[Record]:
    """A tiny-model worker's start (forked from the preloaded parent) and its first adapter's
    load against a fresh process doing what a user would otherwise do: import, load the model
    and the adapter."""
    import openai
    from peft import get_peft_model

    from bench.models import adapter as adapter_config
    from launcher.ports import free_port
    from launcher.stack import Stack

    with tempfile.TemporaryDirectory(prefix="symb-cold-") as scratch:
        root = Path(scratch)
        adapter = root / "adapter"
        get_peft_model(AutoModelForCausalLM.from_pretrained(resolve_model(MODEL)),
                       adapter_config("lora", 8)).save_pretrained(adapter)
        subprocess.run([sys.executable, "-m", "launcher.cli", "adapters", "register", str(adapter),
                        "--tenant", "acme", "--name", "a", "--data-dir", str(root / "data")],
                       check=True, capture_output=True)
        stack = Stack(root / "data", MODEL, port=free_port(),
                      env={"SYMBIOSIS_API_KEYS": "acme=sk-cold"}).start()
        try:
            client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="sk-cold")
            client.completions.create(model="acme/a", prompt="hi", max_tokens=1)
            log = "".join(stack.services["manager"].log)
            ours = float(re.findall(r"worker acme ready in ([0-9.]+) s", log)[-1]) + \
                float(re.findall(r"adapter acme/a@1 loaded in ([0-9.]+) ms", log)[-1]) / 1e3
        finally:
            stack.stop()
        script = ("import time; t=time.perf_counter(); import torch, transformers, peft; "
                  "from transformers import AutoModelForCausalLM; from peft import PeftModel; "
                  f"m=AutoModelForCausalLM.from_pretrained({str(resolve_model(MODEL))!r}); "
                  f"m=PeftModel.from_pretrained(m, {str(adapter)!r}); "
                  "print(time.perf_counter()-t)")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             check=True)
        plain = float(out.stdout.strip().splitlines()[-1])
    return [Record("cold start", "tiny-model worker ready (model + adapter)", ours, plain, "s",
                   "<= 1 s", higher_is_better=False,
                   note="baseline: a fresh process importing and loading the same")]
