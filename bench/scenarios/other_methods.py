"""Many adapters (13), IA3 and prompt tuning: adapters of one method in one batch (IA3: a group,
each row scaled by its own adapter's vectors; prompt tuning: each prompt through its own model
over the shared base, then one decode batch) against one peft process holding them, which
serves one such adapter a forward (`set_adapter`, then `generate`: peft mixes neither in a
batch); and the memory a resident adapter of the method holds against its file."""

from __future__ import annotations

from pathlib import Path

from bench.records import Record
from bench.scenarios.adapter_sides import best_speeds, resident_bytes

BATCH = 8
LABEL = {"ia3": "IA3", "prompt_tuning": "prompt tuning"}


def method_records(method: str, ours, paths: list[Path], prompt: list[int],
                   threads: int) -> list[Record]:
    """`ours`: a fresh `adapter_sides.Ours`; `paths`: adapters of `method`, one config, more than
    BATCH; `threads`: the peft process's."""
    speed = batch_speed(ours, paths[:BATCH], prompt, threads)
    file_mib = (paths[1] / "adapter_model.safetensors").stat().st_size / 2**20
    per_adapter = resident_bytes(ours, paths[BATCH:]) / 2**20
    name = "13 many adapters"
    return [
        Record(name, f"{LABEL[method]}: {BATCH} adapters in one batch: decode tokens/s vs one "
               "peft process holding them (one adapter a generate)", speed["ours"],
               speed["plain"], "tok/s", ">= 1.0x"),
        Record(name, f"{LABEL[method]}: memory per resident adapter vs its file size "
               "(+0.05 MiB)", per_adapter, file_mib + 0.05, "MiB", "<= 2.0x",
               higher_is_better=False),
    ]


def batch_speed(ours, paths: list[Path], prompt: list[int], threads: int,
                tokens: int = 16) -> dict[str, float]:
    """Tokens/s of len(paths) requests, each with its own adapter, against one peft process (on
    `threads`) serving them one adapter a `generate`."""
    return best_speeds(ours, paths, prompt, tokens, mixed=False, threads=threads)
