"""Stored responses through real processes with the official openai SDK: a response goes on
from an earlier one as the whole conversation sent at once would (greedy text equal to plain
peft's), is read again as it was answered, lists its input items, and is its tenant's alone
until deleted; `store: false` keeps nothing. Items kept are sent again by reference
(`item_reference`) as if sent whole."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.conftest import OPERATOR, Deployment
from tests.e2e.test_responses_api import TOOLS

pytestmark = pytest.mark.slow
ASK = {"model": "acme/lora-a", "max_output_tokens": 6, "temperature": 0}


def test_previous_response_id_goes_on_as_the_whole_conversation_would(
        deployment: Deployment) -> None:
    client = deployment.client("acme")
    first = client.responses.create(input="Say hello.", instructions="Be brief.",
                                    metadata={"topic": "greeting"}, **ASK)
    assert first.store and first.metadata == {"topic": "greeting"}
    second = client.responses.create(previous_response_id=first.id, input="Again.", **ASK)
    assert second.previous_response_id == first.id and second.store
    reference = deployment.reference("acme/lora-a")
    messages = [{"role": "user", "content": "Say hello."},  # instructions are not carried on
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "Again."}]
    ids = reference.ids(messages=messages)
    assert second.output_text == reference.text(reference.greedy(ids, 6))
    assert second.usage.input_tokens == len(ids)
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    items = client.responses.input_items.list(second.id, order="asc")
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == \
        [("message", "user", "Again.")] and items.data[0].id.startswith("msg_")
    third = client.responses.create(previous_response_id=second.id,
                                    input=[{"role": "user", "content": "Once more."},
                                           {"role": "user", "content": "Please."}], **ASK)
    page = client.responses.input_items.list(third.id, limit=1)  # the last first
    assert [i.content[0].text for i in page.data] == ["Please."] and page.has_more
    rest = client.responses.input_items.list(third.id, limit=1, after=page.data[0].id)
    assert [i.content[0].text for i in rest.data] == ["Once more."] and not rest.has_more
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    again = client.responses.create(previous_response_id=second.id, input="Again.", **ASK)
    assert again.status in ("completed", "incomplete")  # its own conversation was kept whole


def test_a_streamed_response_is_kept_before_its_last_event(deployment: Deployment) -> None:
    client = deployment.client("acme")
    events = list(client.responses.create(input="Say hello.", stream=True, **ASK))
    final = events[-1].response
    assert final.store and client.responses.retrieve(final.id).output_text == final.output_text
    chained = client.responses.create(previous_response_id=final.id, input="Again.", **ASK)
    assert chained.usage.input_tokens > final.usage.input_tokens


def test_a_call_answered_by_a_request_that_goes_on_from_it(deployment: Deployment) -> None:
    client = deployment.client("acme")
    called = client.responses.create(input="Weather in Paris?", tools=TOOLS,
                                     tool_choice="required", parallel_tool_calls=False,
                                     model="acme/lora-a", max_output_tokens=200)
    call = called.output[0]
    assert call.type == "function_call"
    with pytest.raises(openai.BadRequestError) as unanswered:
        client.responses.create(previous_response_id=called.id, input="And?", **ASK)
    assert unanswered.value.body["param"] == "input"
    assert "No tool output found" in unanswered.value.body["message"]
    answered = client.responses.create(
        previous_response_id=called.id, tools=TOOLS, **ASK,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert answered.status in ("completed", "incomplete")


def test_items_kept_are_sent_again_by_reference(deployment: Deployment) -> None:
    client = deployment.client("acme")
    called = client.responses.create(input="Weather in Paris?", tools=TOOLS,
                                     tool_choice="required", parallel_tool_calls=False,
                                     model="acme/lora-a", max_output_tokens=200)
    call, = called.output
    asked, = client.responses.input_items.list(called.id).data
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    by_reference = [{"type": "item_reference", "id": asked.id},
                    {"type": "item_reference", "id": call.id}, answer]
    whole = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": call.call_id, "name": call.name,
              "arguments": call.arguments}, answer]
    answered = client.responses.create(input=by_reference, tools=TOOLS, **ASK)
    alone = client.responses.create(input=whole, tools=TOOLS, **ASK)
    assert (answered.output_text, answered.usage.input_tokens) == \
        (alone.output_text, alone.usage.input_tokens)
    assert client.responses.input_tokens.count(model="acme/lora-a", input=by_reference,
                                               tools=TOOLS).input_tokens == \
        alone.usage.input_tokens
    listed = client.responses.input_items.list(answered.id, order="asc").data
    assert [(item.type, item.id) for item in listed[:2]] == \
        [("message", asked.id), ("function_call", call.id)]  # kept as the items named
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(input=[answer, {"type": "item_reference", "id": "fc_none"}],
                                **ASK)
    assert (missing.value.code, missing.value.body["param"]) == ("item_not_found", "input[1]")
    with pytest.raises(openai.NotFoundError):  # acme's item, not beta's
        deployment.client("beta").responses.create(
            input=[{"type": "item_reference", "id": call.id}], **{**ASK, "model": "beta/ia3-b"})


def test_nothing_is_kept_with_store_false_and_a_tenant_sees_only_its_own(
        deployment: Deployment) -> None:
    acme, beta = deployment.client("acme"), deployment.client("beta")
    unkept = acme.responses.create(input="Hi", store=False, **ASK)
    kept = acme.responses.create(input="Hi", **ASK)
    assert not unkept.store and kept.store
    for client, response_id in ((acme, unkept.id), (beta, kept.id)):
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.retrieve(response_id)
        assert missing.value.body["message"] == f"Response with id '{response_id}' not found."
        with pytest.raises(openai.NotFoundError):
            client.responses.input_items.list(response_id)
        with pytest.raises(openai.NotFoundError):
            client.responses.delete(response_id)
    with pytest.raises(openai.NotFoundError) as refused:
        acme.responses.create(previous_response_id=unkept.id, input="Again.", **ASK)
    assert refused.value.body["param"] == "previous_response_id"
    assert acme.responses.retrieve(kept.id).id == kept.id  # beta's delete left it
    metrics = httpx.get(f"{deployment.stack.base_url}/metrics", headers=OPERATOR,
                        timeout=30).text
    assert 'symbiosis_stored_responses_total{kept="true",tenant="acme"}' in metrics
