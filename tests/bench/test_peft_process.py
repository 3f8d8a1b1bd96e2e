"""The many-adapters scenarios' baseline in a process of its own: at OpenMP's defaults, and
making what the same peft model makes in this process."""

import torch

from bench.models import FIXED_LENGTH
from bench.peft_process import PeftProcess, holding
from bench.scenarios.adapter_sides import MODEL, make_adapters
from catalogue.resolve import resolve_model

PROMPT = [5, 17, 301, 42]


def _here(paths, mixed: bool) -> list[list[int]]:
    model = holding(str(resolve_model(MODEL)), [str(p) for p in paths])
    options = {"max_new_tokens": 3, "do_sample": False, **FIXED_LENGTH}
    with torch.no_grad():
        if mixed:
            ids = torch.tensor([PROMPT] * len(paths))
            return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                  adapter_names=[f"a{k}" for k in range(len(paths))],
                                  **options).tolist()
        made = []
        for k in range(len(paths)):
            model.set_adapter(f"a{k}")
            ids = torch.tensor([PROMPT])
            made += model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                   **options).tolist()
        return made


def test_the_peft_process_makes_what_peft_makes_here_at_openmps_defaults(tmp_path) -> None:
    paths = make_adapters(tmp_path, 3)
    for mixed in (True, False):
        with PeftProcess(resolve_model(MODEL), paths, PROMPT, 3, 1, mixed) as plain:
            seconds, made = plain.generate()
            assert plain.wait_policy is None  # OpenMP's default, as a user runs peft
        assert seconds > 0
        assert made == _here(paths, mixed)
        assert len(made) == 3 and all(len(s) == len(PROMPT) + 3 for s in made)
