"""Conversations through real processes with the official openai SDK: a response that goes on
in a conversation reads its items first (the same answer and token count as the whole history
sent as input, and as previous_response_id naming its predecessor there) and adds its input
and output to it (streamed, stored or not, in the background; before the client has the
answer), logprobs read back only when included; the SDK's calls create, page, read, tag and
delete conversations and their items; a conversation is its tenant's alone, and one with
previous_response_id is refused. One response at a time goes on in a conversation: a background
one waits for the streamed one before it and reads its turn; a stream the client leaves gives
the turn back and adds nothing."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.e2e.conftest import OPERATOR, Deployment
from tests.e2e.test_background import polled

pytestmark = pytest.mark.slow
LOGPROBS = "message.output_text.logprobs"
ASK = {"model": "acme/lora-a", "max_output_tokens": 5, "temperature": 0}


def said(items) -> list[tuple[str, str]]:
    """Each message item's role and text (function items: their type and call_id)."""
    return [(item.role, "".join(part.text for part in item.content))
            if item.type == "message" else (item.type, item.call_id) for item in items]


def test_a_response_goes_on_in_a_conversation_and_adds_its_turn(
        deployment: Deployment) -> None:
    client = deployment.client("acme")
    talk = client.conversations.create(
        items=[{"role": "user", "content": "Hello."},
               {"role": "assistant", "content": "Hi! How can I help?"}],
        metadata={"topic": "greeting"})
    assert client.conversations.retrieve(talk.id).to_dict() == talk.to_dict()
    first = client.responses.create(input="Tell me a story.", conversation=talk.id,
                                    include=[LOGPROBS], **ASK)
    assert first.conversation.id == talk.id
    history = [{"role": "user", "content": "Hello."},
               {"role": "assistant", "content": "Hi! How can I help?"},
               {"role": "user", "content": "Tell me a story."}]
    alone = client.responses.create(input=history, **ASK)
    assert first.output_text == alone.output_text
    assert first.usage.input_tokens == alone.usage.input_tokens
    items = list(client.conversations.items.list(talk.id, order="asc"))
    assert said(items) == [("user", "Hello."), ("assistant", "Hi! How can I help?"),
                           ("user", "Tell me a story."), ("assistant", first.output_text)]
    assert items[-1].id == first.output[0].id  # the response's output item, as it is
    assert items[-1].content[0].logprobs == []  # unless included:
    with_logprobs = client.conversations.items.retrieve(items[-1].id, conversation_id=talk.id,
                                                        include=[LOGPROBS])
    assert with_logprobs.content[0].logprobs == first.output[0].content[0].logprobs
    assert len(with_logprobs.content[0].logprobs) == first.usage.output_tokens

    going_on = {"input": "Again.", "conversation": {"id": talk.id}}
    counted = client.responses.input_tokens.count(model="acme/lora-a", **going_on)
    assert counted.input_tokens == client.responses.input_tokens.count(
        model="acme/lora-a", input="Again.", previous_response_id=first.id).input_tokens
    chunks = list(client.responses.create(stream=True, store=False, **going_on, **ASK))
    done = chunks[-1].response
    assert done.usage.input_tokens == counted.input_tokens == client.responses.create(
        input=[*history, {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "Again."}], **ASK).usage.input_tokens
    newest = client.conversations.items.list(talk.id, limit=2)  # the last first
    assert said(newest.data) == [("assistant", done.output_text), ("user", "Again.")]
    assert newest.has_more and len(list(client.conversations.items.list(talk.id, limit=2))) == 6

    queued = client.responses.create(input="Once more.", conversation=talk.id, background=True,
                                     **ASK)
    ran, _ = polled(client, queued.id)
    assert ran.conversation.id == talk.id and ran.status in ("completed", "incomplete")
    assert said(client.conversations.items.list(talk.id, limit=2).data) == \
        [("assistant", ran.output_text), ("user", "Once more.")]


def test_the_sdks_item_calls_and_a_conversations_bounds(deployment: Deployment) -> None:
    client = deployment.client("acme")
    talk = client.conversations.create()
    added = client.conversations.items.create(talk.id, items=[
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "user", "content": "So?"}])
    assert said(added.data) == [("function_call", "c1"), ("function_call_output", "c1"),
                                ("user", "So?")]
    call = client.conversations.items.retrieve(added.data[0].id, conversation_id=talk.id)
    assert (call.name, call.arguments, call.id) == ("weather", "{}", added.data[0].id)
    answered = client.responses.create(input="Answer.", conversation=talk.id, **ASK)
    assert answered.status in ("completed", "incomplete")
    after = client.conversations.items.delete(added.data[2].id, conversation_id=talk.id)
    assert after.id == talk.id
    assert said(client.conversations.items.list(talk.id, order="asc"))[:3] == \
        [("function_call", "c1"), ("function_call_output", "c1"), ("user", "Answer.")]
    client.conversations.items.delete(added.data[1].id, conversation_id=talk.id)
    with pytest.raises(openai.BadRequestError) as unanswered:  # the call's output is gone
        client.responses.create(input="And now?", conversation=talk.id, **ASK)
    assert "No tool output found for function call c1" in unanswered.value.body["message"]
    assert unanswered.value.body["param"] == "conversation"  # where the fault is

    tagged = client.conversations.update(talk.id, metadata={"n": "1"})
    assert tagged.metadata == {"n": "1"}
    with pytest.raises(openai.BadRequestError) as both:
        client.responses.create(input="Hi.", conversation=talk.id,
                                previous_response_id=answered.id, **ASK)
    assert both.value.body["param"] == "conversation"
    with pytest.raises(openai.NotFoundError) as theirs:  # acme's, not beta's
        deployment.client("beta").responses.create(
            input="Hi.", conversation=talk.id, **{**ASK, "model": "beta/ia3-b"})
    assert theirs.value.body["param"] == "conversation"
    deleted = client.conversations.delete(talk.id)
    assert (deleted.id, deleted.deleted, deleted.object) == \
        (talk.id, True, "conversation.deleted")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(input="Hi.", conversation=talk.id, **ASK)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list(talk.id)
    metrics = httpx.get(f"{deployment.stack.base_url}/metrics", headers=OPERATOR,
                        timeout=30).text
    assert 'symbiosis_conversation_turns_total{added="true",tenant="acme"}' in metrics



def test_one_response_at_a_time_goes_on_in_a_conversation(deployment: Deployment) -> None:
    client = deployment.client("acme")
    talk = client.conversations.create()
    streamed = client.responses.create(input="First.", conversation=talk.id, stream=True,
                                       **{**ASK, "max_output_tokens": 40})
    assert next(iter(streamed)).type == "response.created"  # it holds the turn
    waiting = client.responses.create(input="Second.", conversation=talk.id, background=True,
                                      **ASK)  # it runs once the first has added its turn
    first = [event for event in streamed][-1].response
    second, _ = polled(client, waiting.id)
    assert second.status in ("completed", "incomplete")
    history = [{"role": "user", "content": "First."},
               {"role": "assistant", "content": first.output_text},
               {"role": "user", "content": "Second."}]
    assert second.usage.input_tokens == client.responses.input_tokens.count(
        model="acme/lora-a", input=history).input_tokens
    assert said(client.conversations.items.list(talk.id, order="asc")) == [
        *[(said_["role"], said_["content"]) for said_ in history],
        ("assistant", second.output_text)]

    dropped = client.responses.create(input="Long.", conversation=talk.id, stream=True,
                                      **{**ASK, "max_output_tokens": 500})  # (greedy: no end
    # of text in 500 tokens here, so it cannot end, and add its turn, before its client leaves)
    assert next(iter(dropped)).type == "response.created"
    dropped.close()  # the client leaves: the turn is given back, nothing added
    third = went_on(client, talk.id)
    assert said(client.conversations.items.list(talk.id, order="asc"))[4:] == [
        ("user", "Third."), ("assistant", third.output_text)]

def went_on(client: openai.OpenAI, conversation_id: str, timeout_s: float = 60.0):
    """The response to "Third." in the conversation, sent again while another holds its turn
    (as OpenAI's answer asks: "Please retry in a few seconds")."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.responses.create(input="Third.", conversation=conversation_id, **ASK)
        except openai.BadRequestError as refused:
            assert refused.code == "conversation_locked" and time.monotonic() < deadline
            time.sleep(0.1)
