"""Worker results -> OpenAI response bodies and stream chunks (completions and chat)."""

from __future__ import annotations

import json

from gateway.obfuscation import is_delta, padded
from gateway.serving import PromptResult
from gateway.tools import ToolMode
from openapi.chat import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
)
from openapi.common import Usage
from openapi.completions import CompletionChoice, CompletionLogprobs, CompletionResponse
from wire import manager as W


def usage(results: list[PromptResult]) -> Usage:
    prompt = sum(r.started.prompt_tokens for r in results)
    completion = sum(r.done.completion_tokens for r in results if r.done)
    return Usage(prompt_tokens=prompt, completion_tokens=completion,
                 total_tokens=prompt + completion)


def sse(payload: dict | str, obfuscate: bool = False) -> bytes:
    """A server-sent event; a Responses API event is named by its type, as OpenAI names it.
    `obfuscate`: a delta is padded (`gateway.obfuscation`)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    if obfuscate and isinstance(payload, dict) and is_delta(payload):
        data = padded(data)
    kind = payload.get("type") if isinstance(payload, dict) else None
    named = f"event: {kind}\n" if isinstance(kind, str) and (
        kind.startswith("response.") or kind == "error") else ""
    return f"{named}data: {data}\n\n".encode()


# -- completions -------------------------------------------------------------------------------

def completion_logprobs(items: list[W.TokenLogprob], offset: int) -> CompletionLogprobs:
    tokens, values, tops, offsets = [], [], [], []
    for item in items:
        known = item.logprob == item.logprob  # NaN: the first prompt token has no logprob
        tokens.append(item.token)
        values.append(item.logprob if known else None)
        tops.append(dict(item.top) if known else None)
        offsets.append(offset)
        offset += len(item.token)
    return CompletionLogprobs(tokens=tokens, token_logprobs=values, top_logprobs=tops,
                              text_offset=offsets)


def completion_choice(result: PromptResult, index: int, n: int, want_logprobs: bool,
                      echo: bool) -> CompletionChoice:
    text = result.text.get(index, "")
    logprobs = None
    if want_logprobs:
        items = list(result.started.prompt_logprobs or []) if echo else []
        items.extend(result.logprobs.get(index, []))
        logprobs = completion_logprobs(items, 0)
    if echo:
        text = result.started.prompt_text + text
    return CompletionChoice(index=result.index * n + index, text=text, logprobs=logprobs,
                            finish_reason=result.finish.get(index))


def best_of(result: PromptResult, n: int, total: int) -> PromptResult:
    """OpenAI's best_of: of `total` sequences, the `n` whose tokens have the highest mean
    logprob, best first."""
    def score(index: int) -> float:
        values = [t.logprob for t in result.logprobs.get(index, [])]
        return sum(values) / len(values) if values else float("-inf")

    chosen = sorted(range(total), key=score, reverse=True)[:n]
    return PromptResult(result.index, result.started,
                        {k: result.text.get(i, "") for k, i in enumerate(chosen)},
                        {k: result.logprobs.get(i, []) for k, i in enumerate(chosen)},
                        {k: result.finish[i] for k, i in enumerate(chosen) if i in result.finish},
                        result.done)


def completion_response(response_id: str, created: int, model: str, results: list[PromptResult],
                        n: int, want_logprobs: bool, echo: bool) -> CompletionResponse:
    choices = [completion_choice(r, i, n, want_logprobs, echo) for r in results for i in range(n)]
    return CompletionResponse(id=response_id, created=created, model=model, choices=choices,
                              usage=usage(results))


def completion_chunk(response_id: str, created: int, model: str, result: PromptResult,
                     delta: W.Delta, n: int, offset: int = 0) -> dict:
    """A chunk of one choice; `offset`: where its text starts in the choice's whole text (the
    logprobs' text_offset counts from there, as in the response made at once)."""
    logprobs = None
    if delta.logprobs:
        logprobs = completion_logprobs(list(delta.logprobs), offset).model_dump()
    choice = {"index": result.index * n + delta.index, "text": delta.text,
              "logprobs": logprobs, "finish_reason": delta.finish_reason}
    return {"id": response_id, "object": "text_completion", "created": created, "model": model,
            "choices": [choice]}


# -- chat --------------------------------------------------------------------------------------

def chat_logprobs(items: list[W.TokenLogprob]) -> ChoiceLogprobs:
    return ChoiceLogprobs(content=[
        TokenLogprob(token=t.token, logprob=t.logprob, bytes=t.token_bytes,
                     top_logprobs=[TopLogprob(token=tok, logprob=lp,
                                              bytes=list(tok.encode("utf-8")))
                                   for tok, lp in t.top])
        for t in items])


def chat_choice(result: PromptResult, index: int, want_logprobs: bool,
                tools: ToolMode) -> ChatChoice:
    text, finish = result.text.get(index, ""), result.finish.get(index)
    calls, finish = tools.answer(text, finish)
    message = AssistantMessage(content=None, tool_calls=calls or None) if calls is not None \
        else AssistantMessage(content=text)
    return ChatChoice(index=index, message=message,
                      logprobs=chat_logprobs(result.logprobs.get(index, []))
                      if want_logprobs else None,
                      finish_reason=finish)


def chat_response(response_id: str, created: int, model: str, result: PromptResult, n: int,
                  want_logprobs: bool, tools: ToolMode) -> ChatCompletionResponse:
    choices = [chat_choice(result, i, want_logprobs, tools) for i in range(n)]
    return ChatCompletionResponse(id=response_id, created=created, model=model, choices=choices,
                                  usage=usage([result]))


def chat_chunk(response_id: str, created: int, model: str, index: int, *,
               role: bool = False, content: str | None = None,
               logprobs: list[W.TokenLogprob] | None = None,
               finish_reason: str | None = None,
               tool_calls: list[ToolCallDelta] | None = None) -> dict:
    delta = Delta(role="assistant" if role else None, content=content, tool_calls=tool_calls)
    choice = ChunkChoice(index=index, delta=delta, finish_reason=finish_reason,
                         logprobs=chat_logprobs(logprobs) if logprobs else None)
    chunk = ChatCompletionChunk(id=response_id, created=created, model=model, choices=[choice])
    return chunk.model_dump(exclude_none=False)


def usage_chunk(response_id: str, created: int, model: str, obj: str,
                results: list[PromptResult]) -> dict:
    return {"id": response_id, "object": obj, "created": created, "model": model,
            "choices": [], "usage": usage(results).model_dump()}
