"""A request's prompts as `Generate` fields: a text, texts, token ids or lists of them (a
completion's `prompt`, an embedding request's `input`), one prompt each."""

from __future__ import annotations

from gateway.errors import APIError


def prompt_specs(prompt: str | list, vocab_size: int = 0, param: str = "prompt") -> list[dict]:
    """One `Generate`'s fields a prompt; a token id outside the vocabulary (where known here)
    refused, naming `param`."""
    specs = _prompt_specs(prompt, param)
    for spec in specs:
        bad = next((t for t in spec.get("prompt_ids", ()) if vocab_size and t >= vocab_size),
                   None)
        if bad is not None:
            raise APIError(400, f"Token id {bad} is out of range: this model's vocabulary has "
                           f"{vocab_size} tokens (ids 0 to {vocab_size - 1}).", "invalid_prompt",
                           param)
    return specs


def _prompt_specs(prompt: str | list, param: str) -> list[dict]:
    if isinstance(prompt, str):
        return [{"prompt": prompt}]
    if not prompt:
        raise APIError(400, f"{param} must not be empty", "invalid_prompt", param)
    if all(isinstance(p, int) for p in prompt):
        return [{"prompt_ids": list(prompt)}]
    if all(isinstance(p, str) for p in prompt):
        return [{"prompt": p} for p in prompt]
    if all(isinstance(p, list) and p for p in prompt):
        return [{"prompt_ids": list(p)} for p in prompt]
    raise APIError(400, f"{param} must be a string, a list of strings, a list of token ids or "
                   "a list of lists of token ids", "invalid_prompt", param)
