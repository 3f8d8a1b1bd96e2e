"""The Responses API on the chat path: a request becomes a chat request, a chat answer a
response. The conversation is checked in the Responses API's own terms first (its refusals
name `input.N`), so that the chat request made from it holds the chat API's rules."""

from __future__ import annotations

import uuid

from pydantic import TypeAdapter

from gateway import sampling
from gateway.errors import APIError, check_metadata, unsupported_parameter
from gateway.responses import chat_logprobs
from gateway.serving import PromptResult
from gateway.tiers import DEFAULT, FLEX, asks_flex
from gateway.tools import ToolMode
from openapi.chat import ChatCompletionRequest
from openapi.common import RefusalPart
from openapi.items import FunctionCallItem, FunctionCallOutputItem, InputItem, MessageItem
from openapi.responses import (
    ConversationRef,
    IncompleteDetails,
    OutputFunctionCall,
    OutputMessage,
    OutputText,
    Response,
    ResponseRequest,
    ResponseUsage,
)

UNSUPPORTED = {  # set (and not empty or false): refused
    "reasoning": "the models served here are not reasoning models",
    "prompt": "there are no stored prompts here",
    "max_tool_calls": "the number of calls is bounded by parallel_tool_calls here",
    **{name: sampling.UNSUPPORTED[name] for name in (  # as the chat API refuses them
        "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention", "moderation")},
    "context_management": "nothing is compacted here: a conversation too long for the context "
                          "is a 400, or loses its earliest items with truncation 'auto'",
    "background_options": "a background response runs as soon as it can here (no completion "
                          "windows)",
    "access_programs": "there are no access programs here",
    "image": "the models served here read text only",
}
RENAMED = {"response_format": "text.format", "max_completion_tokens": "max_output_tokens"}
LOGPROBS = "message.output_text.logprobs"
ITEMS = TypeAdapter(list[InputItem])


def as_chat(body: ResponseRequest, earlier: list[dict] | None = None) -> ChatCompletionRequest:
    """The chat request that asks the same, going on from the `earlier` items (a stored
    response's conversation and output) if any."""
    _refuse_unsupported(body)
    check_metadata(body.metadata)
    before = ITEMS.validate_python(earlier or [])
    items = [*before, *input_items(body)]
    _check_calls(items, len(before), "input" if body.conversation is None else "conversation")
    _check_words(items, len(before))
    chat = {"model": body.model, "messages": _messages(body.instructions, items),
            "max_completion_tokens": body.max_output_tokens, "temperature": body.temperature,
            "top_p": body.top_p, "stream": body.stream, "user": body.user,
            "safety_identifier": body.safety_identifier, "seed": body.seed,
            "parallel_tool_calls": body.parallel_tool_calls, "logprobs": wants_logprobs(body),
            "top_logprobs": body.top_logprobs, "service_tier": body.service_tier}
    if body.tools is not None:
        chat["tools"] = [{"type": "function", "function": tool.model_dump(
            exclude={"type"}, exclude_none=True)} for tool in body.tools]
    if body.tool_choice is not None:
        chat["tool_choice"] = body.tool_choice if isinstance(body.tool_choice, str) else \
            {"type": "function", "function": {"name": body.tool_choice.name}}
    if body.text is not None and body.text.format is not None:
        chat["response_format"] = _response_format(body.text.format)
    if not chat["messages"]:
        raise APIError(400, "Invalid value for 'input': it is empty and there are no "
                       "instructions; the model needs something to answer.", "invalid_request",
                       "input")
    return ChatCompletionRequest.model_validate(chat)


def input_items(body: ResponseRequest) -> list:
    return [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) \
        else body.input


def conversation_of(body: ResponseRequest) -> str | None:
    """The id of the conversation the request goes on in, if any."""
    named = body.conversation
    return named.id if isinstance(named, ConversationRef) else named


def wants_logprobs(body: ResponseRequest) -> bool:
    return LOGPROBS in (body.include or []) or body.top_logprobs is not None


def renamed(error: APIError) -> APIError:
    """A refusal of the chat request made from a response request, in the latter's names."""
    for chat_name, name in RENAMED.items():
        if error.param == chat_name:
            error.param = name
            error.message = error.message.replace(chat_name, name)
    if error.param and error.param.startswith("tools.") and ".function." in error.param:
        error.param = error.param.replace(".function.", ".")
    return error


def response(response_id: str, created: int, body: ResponseRequest, result: PromptResult,
             tools: ToolMode) -> Response:
    text, finish = result.text.get(0, ""), result.finish.get(0)
    calls, finish = tools.answer(text, finish)
    cut = finish == "length"
    if calls is None:
        logprobs = chat_logprobs(result.logprobs.get(0, [])).model_dump()["content"] \
            if wants_logprobs(body) else []
        output = [OutputMessage(id=item_id("msg"), status="completed", content=[
            OutputText(text=text, logprobs=logprobs)])] if text or logprobs else []
    else:
        output = [OutputFunctionCall(id=item_id("fc"), call_id=c.id, name=c.function.name,
                                     arguments=c.function.arguments, status="completed")
                  for c in calls]
    if cut and output:  # the item the cut ended (as a stream leaves it)
        output[-1].status = "incomplete"
    return described(body, Response(
        id=response_id, created_at=created, status="incomplete" if cut else "completed",
        model=body.model, output=output,
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if cut else None,
        usage=usage(result)))


def usage(result: PromptResult) -> ResponseUsage:
    prompt = result.started.prompt_tokens
    completion = result.done.completion_tokens if result.done else 0
    return ResponseUsage(input_tokens=prompt, output_tokens=completion,
                         total_tokens=prompt + completion)


def described(body: ResponseRequest, response: Response) -> Response:
    """The request's settings, as a response repeats them."""
    response.instructions = body.instructions
    response.max_output_tokens = body.max_output_tokens
    response.temperature = 1.0 if body.temperature is None else body.temperature
    response.top_p = 1.0 if body.top_p is None else body.top_p
    response.parallel_tool_calls = body.parallel_tool_calls is not False
    response.tool_choice = body.tool_choice.model_dump() if \
        body.tool_choice is not None and not isinstance(body.tool_choice, str) else \
        body.tool_choice or "auto"
    response.tools = [tool.model_dump(exclude_none=True) for tool in body.tools or []]
    if body.text is not None and body.text.format is not None:
        response.text = {"format": body.text.format.model_dump(by_alias=True,
                                                               exclude_none=True)}
    response.user = body.user
    response.previous_response_id = body.previous_response_id
    named = conversation_of(body)
    response.conversation = ConversationRef(id=named) if named else None
    response.truncation = body.truncation or "disabled"
    response.service_tier = FLEX if asks_flex(body.service_tier) else DEFAULT
    response.store = body.store is not False
    response.background = body.background is True
    response.metadata = body.metadata or {}
    return response


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _refuse_unsupported(body: ResponseRequest) -> None:
    for k, name in enumerate(body.include or []):
        if name != LOGPROBS:
            raise APIError(400, f"Invalid value for 'include.{k}': {name!r} cannot be included "
                           f"here; only {LOGPROBS!r} can.", "invalid_request", f"include.{k}")
    for name, reason in UNSUPPORTED.items():
        value = getattr(body, name)  # unset, false or empty; not 0 (== False, in a tuple)
        if not (value is None or value is False or value == [] or value == {}):
            raise unsupported_parameter(name, reason)
    asks_flex(body.service_tier)
    if body.text is not None and body.text.verbosity not in (None, "medium"):
        raise unsupported_parameter("text.verbosity",
                                    "the models served here have no verbosity levels")
    if body.background and body.store is False:
        raise APIError(400, "Invalid value for 'store': a background response is kept (store "
                       "unset or true) so that it can be read once it is done.",
                       "invalid_request", "store")


def _check_calls(items: list, earlier: int, source: str) -> None:
    """Each function call has its own call_id, and the outputs of a run of calls follow it,
    one for each call, before anything else (the first `earlier` items came from
    previous_response_id or the conversation, `source`: a fault there is named so)."""
    open_calls: dict[str, int] = {}
    seen: set[str] = set()

    def at(j: int, field: str = "") -> str:
        return f"input.{j - earlier}{field}" if j >= earlier else source

    for j, item in enumerate(items):
        if isinstance(item, FunctionCallOutputItem):
            if open_calls.pop(item.call_id, None) is None:
                raise APIError(400, "No tool call found for function call output with "
                               f"call_id {item.call_id}: an output answers a function_call "
                               "item before it, once.", "invalid_request", at(j, ".call_id"))
            continue
        calling = isinstance(item, FunctionCallItem) and \
            isinstance(items[j - 1], FunctionCallItem) if j else False
        if open_calls and not calling:
            raise _unanswered(open_calls, at)
        if isinstance(item, FunctionCallItem):
            if item.call_id in seen:
                raise APIError(400, f"Invalid value for '{at(j, '.call_id')}': "
                               f"'{item.call_id}' is the call_id of an earlier function call; "
                               "each call needs its own.", "invalid_request", at(j, ".call_id"))
            seen.add(item.call_id)
            open_calls[item.call_id] = j
    if open_calls:
        raise _unanswered(open_calls, at)


def _unanswered(open_calls: dict[str, int], at) -> APIError:
    call_id, j = next(iter(open_calls.items()))
    return APIError(400, f"No tool output found for function call {call_id}: the outputs of "
                    "function calls follow them (a function_call_output item for each, before "
                    "any other item).", "invalid_request", at(j))


def _check_words(items: list, earlier: int) -> None:
    """Only the model refuses: a refusal part is an assistant message's (as in the chat API)."""
    for j, item in enumerate(items[earlier:]):
        if not isinstance(item, MessageItem) or item.role == "assistant" or \
                isinstance(item.content, str):
            continue
        for k, part in enumerate(item.content):
            if isinstance(part, RefusalPart):
                param = f"input.{j}.content.{k}.type"
                raise APIError(400, f"Invalid value for '{param}': a {item.role} message's "
                               "content has text parts only: a refusal part is an assistant's.",
                               "invalid_request", param)


def _messages(instructions: str | None, items: list) -> list[dict]:
    out: list[dict] = []
    if instructions is not None:
        out.append({"role": "system", "content": instructions})
    for item in items:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        else:
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if out and out[-1]["role"] == "assistant":  # its text, or the calls before
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
    return out


def _response_format(text_format) -> dict:
    if text_format.type != "json_schema":
        return {"type": text_format.type}
    schema = text_format.model_dump(by_alias=True, exclude={"type"}, exclude_none=True)
    return {"type": "json_schema", "json_schema": schema}
