"""A DPO job's work for the benchmark client (`bench.workload --kind dpo`): preference pairs made
from GSM8K's chat file (each question's own answer preferred over the next question's), their
reference log-probabilities taken before the window, as a job takes them before its first step,
and DPO steps over them on either side by the trainer's own step
(`workers.training.preference.preference_step`): ours through the executor's head loss, each
pair's prompt run once (`workers.training.shared_prompt`); plain from the logits (only the
outputs' positions normalized), each output run whole with its prompt, as peft's users run DPO
(TRL's concatenated forward)."""

from __future__ import annotations

import itertools
import json
import tempfile
import time
from pathlib import Path

import torch

from bench.loops import settle

PAIRS = 16  # cycled through; their references are computed before the window
BETA = 0.1  # OpenAI's "auto"


def preference_pairs(model, tokenizer, chat_file: Path, pad_id: int, max_seq_length: int,
                     count: int = PAIRS, history: int = 0) -> list:
    """`count` pairs of the file's first conversations, each with its references; with
    `history`, each conversation opens with the (up to) `history` exchanges before it in the
    file, as a multi-turn chat's later answer."""
    from workers.training.data import load_examples
    from workers.training.loop import Hyperparameters
    from workers.training.preference import remember_references

    with chat_file.open() as f:
        chats = [json.loads(next(f))["messages"] for _ in range(count + 1)]
    rows = [{"input": {"messages": [*itertools.chain(*chats[max(0, k - history):k]),
                                    *chat[:-1]]},
             "preferred_output": chat[-1:], "non_preferred_output": following[-1:]}
            for k, (chat, following) in enumerate(itertools.pairwise(chats))]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "pairs.jsonl"
        path.write_text("\n".join(json.dumps(row) for row in rows))
        pairs = load_examples(path, tokenizer, max_seq_length)
    remember_references(model, pairs, pad_id, Hyperparameters(1, 1, 1.0).micro_batch_tokens)
    return pairs


def train_pairs(model, pairs: list, pad_id: int, batch: int, until: float,
                share_prompt: bool) -> tuple[list[float], float, float]:
    """DPO steps, `batch` pairs a step in order, AdamW, clipping: (step seconds, when the last
    step ended, tokens a step: both outputs' conversations)."""
    from workers.training.loop import Hyperparameters
    from workers.training.preference import preference_step

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    hp = Hyperparameters(1, batch, 1e-4, warmup_ratio=0.0)
    model.train()
    latencies, tokens = [], 0
    while time.monotonic() < until:
        start = len(latencies) * batch
        group = [pairs[(start + i) % len(pairs)] for i in range(batch)]
        started = time.perf_counter()
        preference_step(model, group, pad_id, optimizer, schedule, hp, beta=BETA,
                        share_prompt=share_prompt)
        settle(model.device)
        latencies.append(time.perf_counter() - started)
        tokens += sum(pair.size for pair in group)
    return latencies, time.monotonic(), tokens / max(len(latencies), 1)
