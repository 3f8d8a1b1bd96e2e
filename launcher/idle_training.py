"""Whether a stack's fine-tuning jobs get the executor's idle twin (`executor.twin`).

`SYMBIOSIS_IDLE_TRAINING` true or false decides; unset (or empty), the twin is on wherever one
can be forked: a CPU executor of one shard (on a GPU, the GPU's own scheduling decides, and a
sharded group has no twin), as the executor's `--device` and `--shards` (flag or setting) say.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from launcher.arguments import FALSE, TRUE


def idle_training(settings: Mapping[str, str], executor_args: Sequence[str] = ()) -> bool:
    said = settings.get("SYMBIOSIS_IDLE_TRAINING", "").strip().lower()
    if said in TRUE + FALSE:
        return said in TRUE
    device = flag(executor_args, "--device") or settings.get("SYMBIOSIS_EXECUTOR_DEVICE")
    shards = flag(executor_args, "--shards") or settings.get("SYMBIOSIS_EXECUTOR_SHARDS")
    return (device or "cpu").strip() == "cpu" and (shards or "1").strip() == "1"


def flag(args: Sequence[str], name: str) -> str | None:
    """The last value given to `name` (`--name value` or `--name=value`), if any."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.partition("=")[2]
    return value
