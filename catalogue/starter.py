"""`symbiosis demo` (`python -m catalogue.starter`): starter files for a model, made on the spot.

- `adapter/`: a LoRA adapter (r=8 on the attention's q and v projections, PEFT format), seeded
  and non-trivial, ready for `symbiosis adapters register` or `POST /v1/adapters`;
- `train.jsonl`: a small chat fine-tuning file (arithmetic questions and their answers) that
  `POST /v1/files` accepts and a fine-tuning job trains on in seconds on the built-in model.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import warnings
from pathlib import Path

# peft reads transformers' deprecated `is_gradient_checkpointing`: a warning no user can act on
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)

EXAMPLES = 24


def training_lines(count: int = EXAMPLES, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        lines.append(json.dumps({"messages": [
            {"role": "system", "content": "You answer with the number only."},
            {"role": "user", "content": f"What is {a} + {b}?"},
            {"role": "assistant", "content": str(a + b)}]}))
    return lines


def write_adapter(directory: Path, model: str, seed: int = 0) -> Path:
    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM

    from catalogue.resolve import resolve_model

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(resolve_model(model))
    names = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()}
    targets = [t for t in ("q_proj", "v_proj") if t in names] or ["c_attn"]
    peft = get_peft_model(base, LoraConfig(task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16,
                                           target_modules=targets))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # LoRA B starts at zero: give the adapter an effect to see
        for parameter in peft.parameters():
            if parameter.requires_grad:
                parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    peft.save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="symbiosis demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("examples"))
    parser.add_argument("--model", default="tiny-llama")
    args = parser.parse_args(argv)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        adapter = write_adapter(args.out / "adapter", args.model)
        train = args.out / "train.jsonl"
        train.write_text("\n".join(training_lines()) + "\n")
    except OSError as exc:  # an unknown model (FileNotFoundError), a directory not writable
        sys.stderr.write(f"error: {exc}\n")
        return 1
    sys.stdout.write(f"wrote {adapter}/ (a LoRA adapter for {args.model}) and {train} "
                     f"({EXAMPLES} chat examples)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
