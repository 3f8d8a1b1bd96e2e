"""Training examples: token ids and labels, loss only where the model should learn. The file is
read by `state.training_file`, as the gateway read it when it checked the upload.

Chat: the tokenizer's chat template; the loss is on assistant messages (weight 0 excludes one).
Which tokens an assistant message contributes is found by rendering the conversation up to the
message (with the generation prompt) and up to its end: the difference is the message. This works
with any template whose renderings grow by appending. Prompt/completion: the loss is on the
completion and the end-of-sequence token. Preference (DPO): a pair of chat examples, the same
conversation ending in the preferred and in the non-preferred output, the loss on the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from state.training_file import BadLine, Chat, NotText, Preference, Turn, lines, parse
from state.training_file import Example as TrainingExample

IGNORE = -100


class InvalidTrainingFile(ValueError):
    def __init__(self, example: int | None, message: str) -> None:
        """`example`: the example at fault (None: the file as a whole)."""
        super().__init__(message if example is None else f"Example {example}: {message}")
        self.example = example


def existing(path: str | None, file_id: str) -> Path:
    """The job's file, unless it is gone from disk since."""
    if not path or not Path(path).is_file():
        raise InvalidTrainingFile(None, f"The file {file_id} no longer exists.")
    return Path(path)


@dataclass
class Example:
    ids: list[int]
    labels: list[int]

    @property
    def trained_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE)

    @property
    def size(self) -> int:
        """The tokens a step computes for it."""
        return len(self.ids)


@dataclass
class Pair:
    """A preference example: the conversation with its preferred and its non-preferred output."""

    preferred: Example
    non_preferred: Example
    reference: tuple[float, float] | None = None  # both outputs' log-probabilities under the
    # reference model (`preference.remember_references`)

    @property
    def size(self) -> int:
        return self.preferred.size + self.non_preferred.size


Items = list[Example] | list[Pair]  # what a file holds: examples, or (a DPO job's) pairs


def load_examples(path: str | Path, tokenizer: Any, max_seq_length: int) -> Items:
    examples = []
    with Path(path).open("rb") as f:  # checked at upload: only a changed file fails here
        try:
            for number, line in lines(f):
                try:
                    record = parse(line)
                except BadLine as exc:
                    raise InvalidTrainingFile(number, str(exc)) from None
                examples.append(_example(number, record, tokenizer, max_seq_length))
        except NotText as exc:
            raise InvalidTrainingFile(0, str(exc)) from None
    return examples


def _example(number: int, record: TrainingExample, tokenizer: Any,
             max_seq_length: int) -> Example | Pair:
    if isinstance(record, Preference):
        return Pair(*(_example(number, Chat((*record.prompt, answer)), tokenizer,
                               max_seq_length)
                      for answer in (record.preferred, record.non_preferred)))
    try:
        if isinstance(record, Chat):
            ids, labels = chat_example(record.turns, tokenizer)
        else:
            ids, labels = prompt_completion_example(record.prompt, record.completion, tokenizer)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidTrainingFile(number, f"cannot be tokenized ({exc})") from None
    example = Example(ids[:max_seq_length], labels[:max_seq_length])
    if example.trained_tokens == 0:
        raise InvalidTrainingFile(number, f"has no tokens to learn from within "
                                          f"max_seq_length={max_seq_length}")
    return example


def _render(tokenizer: Any, messages: list[dict], generation_prompt: bool) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False,
                                              add_generation_prompt=generation_prompt))


def chat_example(turns: tuple[Turn, ...], tokenizer: Any) -> tuple[list[int], list[int]]:
    chat = [{"role": "system" if t.role == "developer" else t.role, "content": t.text,
             **({"name": t.name} if t.name else {})} for t in turns]
    ids = _render(tokenizer, chat, False)
    labels = [IGNORE] * len(ids)
    for i, turn in enumerate(turns):
        if turn.role != "assistant" or turn.weight == 0:
            continue
        start = len(_render(tokenizer, chat[:i], True))
        end_ids = _render(tokenizer, chat[: i + 1], False)
        if end_ids != ids[: len(end_ids)]:
            raise ValueError("the chat template does not render conversations by appending")
        labels[start:len(end_ids)] = ids[start:len(end_ids)]
    return ids, labels


def prompt_completion_example(prompt: str, completion: str,
                              tokenizer: Any) -> tuple[list[int], list[int]]:
    prompt_ids = tokenizer.encode(prompt)
    completion_ids = [*tokenizer.encode(completion), tokenizer.eos_token_id]
    return prompt_ids + completion_ids, [IGNORE] * len(prompt_ids) + completion_ids


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The order of examples in an epoch: a permutation from (seed, epoch) alone."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch)).tolist()


def batches(n: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    order = epoch_order(n, seed, epoch)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def collate(examples: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors; padding is masked out of attention and loss."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example.ids)
        ids[row, :n] = torch.tensor(example.ids)
        labels[row, :n] = torch.tensor(example.labels)
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
