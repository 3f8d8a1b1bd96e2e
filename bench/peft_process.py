"""`python -m bench.peft_process`: one plain peft process holding a few adapters, in a process of
its own at OpenMP's defaults (`bench.sides`), which runs one round of generation whenever asked.

The many-adapters scenarios (13) alternate rounds of ours (an engine in the bench's process)
with rounds of this baseline, so both see the same host. Line protocol (JSON, one object per
line): it reads the spec `{"model", "paths", "prompt", "tokens", "threads", "mixed"}`, builds
the model and answers `{"ready": true, "omp_wait_policy": ...}`; then each line it reads runs
one round and it answers `{"seconds": S, "sequences": [...]}` (the ids it made); it exits at the
end of its input. `mixed`: one batch, each row with its own adapter (`adapter_names`); else one
`generate` an adapter (`set_adapter`), as peft serves IA3 and prompt tuning. `embed`
(`{"prompts", "adapters"}`, each prompt's adapter by index): a round is those prompts'
embeddings in one forward (`embeddings`), which it answers as its sequences.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from bench.models import FIXED_LENGTH
from bench.sides import environment, wait_policy


def holding(model: str, paths: list[str]) -> PeftModel:
    """A peft model over `model` (a local path) holding every adapter, named a0, a1, ..."""
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model), paths[0],
                                     adapter_name="a0")
    for k, path in enumerate(paths[1:], start=1):
        peft.load_adapter(path, adapter_name=f"a{k}", low_cpu_mem_usage=True)
    return peft.eval()


def rounds(spec: dict) -> Callable[[], list[list]]:
    """One round of the spec's generation; it returns the sequences made (prompt included), or
    with `embed` the embeddings."""
    model, tokens = holding(spec["model"], spec["paths"]), spec["tokens"]
    names = [f"a{k}" for k in range(len(spec["paths"]))]
    if spec.get("embed"):
        return lambda: embeddings(model, spec["embed"]["prompts"],
                                  [names[k] for k in spec["embed"]["adapters"]])
    options = {"max_new_tokens": tokens, "do_sample": False, **FIXED_LENGTH}
    if spec["mixed"]:
        ids = torch.tensor([spec["prompt"]] * len(names))
        return lambda: model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      adapter_names=names, **options).tolist()
    ids = torch.tensor([spec["prompt"]])

    def each() -> list[list[int]]:
        made = []
        for name in names:
            model.set_adapter(name)
            made += model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                   **options).tolist()
        return made
    return each


def embeddings(model: PeftModel, prompts: list[list[int]], names: list[str]) -> list[list]:
    """The prompts' embeddings in one forward, each row through its adapter (`adapter_names`),
    left-padded: the last layer's hidden state at the last position (the head's logits there
    only), of length 1."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(
        min=0), adapter_names=names, output_hidden_states=True, logits_to_keep=1)
    return torch.nn.functional.normalize(out.hidden_states[-1][:, -1], dim=-1).tolist()


class PeftProcess:
    """The harness's side: start the process, time a round there."""

    def __init__(self, model: Path, paths: list[Path], prompt: list[int], tokens: int,
                 threads: int, mixed: bool, embed: dict | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.peft_process"], text=True,
                                     env=environment("plain"), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        try:
            self._say({"model": str(model), "paths": [str(p) for p in paths], "prompt": prompt,
                       "tokens": tokens, "threads": threads, "mixed": mixed,
                       "embed": embed})
            ready = self._hear()
        except BaseException:
            self.proc.kill()
            raise
        self.wait_policy: str | None = ready["omp_wait_policy"]  # None: OpenMP's default

    def round(self) -> float:
        """Seconds one round took there."""
        return self.generate()[0]

    def generate(self) -> tuple[float, list[list[int]]]:
        """One round there: the seconds it took and the sequences it made."""
        self._say({})
        reply = self._hear()
        return float(reply["seconds"]), reply["sequences"]

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def __enter__(self) -> PeftProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _say(self, message: dict) -> None:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def _hear(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peft process exited ({self.proc.wait()})")
        return json.loads(line)


def main() -> int:
    spec = json.loads(sys.stdin.readline())
    torch.set_num_threads(spec["threads"])
    run = rounds(spec)
    print(json.dumps({"ready": True, "omp_wait_policy": wait_policy()}), flush=True)
    for _ in sys.stdin:
        started = time.perf_counter()
        with torch.no_grad():
            sequences = run()
        print(json.dumps({"seconds": time.perf_counter() - started, "sequences": sequences}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
