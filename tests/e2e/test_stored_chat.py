"""Stored chat completions through real processes with the official openai SDK: a completion
asked to be stored (streamed or not) reads back as it was answered, with its metadata; it lists
the messages it answered, is listed by model and metadata a page at a time, is tagged anew and
is its tenant's alone until deleted; one not asked to be stored is kept nowhere."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from tests.e2e.conftest import OPERATOR, Deployment

pytestmark = pytest.mark.slow
ASK = {"model": "acme/lora-a", "max_completion_tokens": 6, "temperature": 0}
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Say "},
                                         {"type": "text", "text": "hello."}]}]


def ids(page) -> list[str]:
    return [made.id for made in page]


def test_a_stored_completion_reads_back_lists_its_messages_and_is_tagged_anew(
        deployment: Deployment) -> None:
    client = deployment.client("acme")
    run = uuid.uuid4().hex  # this test's own, whatever else the stack keeps
    made = client.chat.completions.create(messages=MESSAGES, store=True,
                                          metadata={"run": run, "kind": "plain"}, **ASK)
    back = client.chat.completions.retrieve(made.id)
    assert back.to_dict() == {**made.to_dict(), "metadata": {"run": run, "kind": "plain"}}

    chunks = list(client.chat.completions.create(
        messages=MESSAGES, store=True, stream=True, n=2, metadata={"run": run, "kind": "stream"},
        **ASK))
    streamed = client.chat.completions.retrieve(chunks[0].id)  # kept before the stream's end
    texts = ["".join(c.choices[0].delta.content or "" for c in chunks
                     if c.choices and c.choices[0].index == i) for i in range(2)]
    assert [choice.message.content for choice in streamed.choices] == texts
    assert [choice.finish_reason for choice in streamed.choices] == ["length", "length"]
    assert streamed.usage.completion_tokens == 12

    assert ids(client.chat.completions.list(metadata={"run": run})) == [made.id, streamed.id]
    assert ids(client.chat.completions.list(metadata={"run": run}, limit=1)) == \
        [made.id, streamed.id]  # the SDK pages on with each page's last id
    newest = client.chat.completions.list(metadata={"run": run}, limit=1, order="desc")
    assert ids(newest.data) == [streamed.id] and newest.has_more
    assert ids(client.chat.completions.list(metadata={"run": run, "kind": "stream"})) == \
        [streamed.id]
    assert ids(client.chat.completions.list(metadata={"run": run}, model="acme/lora-a")) == \
        [made.id, streamed.id]
    assert ids(client.chat.completions.list(metadata={"run": run}, model="acme/prefix-a")) == []

    messages = client.chat.completions.messages.list(made.id)
    assert [(m.id, m.role, m.content) for m in messages.data] == [
        (f"{made.id}-0", "system", "Be brief."), (f"{made.id}-1", "user", "Say hello.")]
    assert messages.data[0].content_parts is None
    assert [part.text for part in messages.data[1].content_parts] == ["Say ", "hello."]
    last = client.chat.completions.messages.list(made.id, order="desc", limit=1)
    assert ids(last.data) == [f"{made.id}-1"] and last.has_more

    tagged = client.chat.completions.update(made.id, metadata={"run": run, "kind": "tagged"})
    assert tagged.to_dict() == {**made.to_dict(), "metadata": {"run": run, "kind": "tagged"}}
    assert ids(client.chat.completions.list(metadata={"run": run, "kind": "tagged"})) == \
        [made.id]


def test_a_tenant_sees_only_its_own_until_it_deletes_them_and_unstored_is_kept_nowhere(
        deployment: Deployment) -> None:
    acme, beta = deployment.client("acme"), deployment.client("beta")
    run = uuid.uuid4().hex
    made = acme.chat.completions.create(messages=MESSAGES, store=True, metadata={"run": run},
                                        **ASK)
    unkept = acme.chat.completions.create(messages=MESSAGES, **ASK)
    for call in (lambda: beta.chat.completions.retrieve(made.id),
                 lambda: beta.chat.completions.messages.list(made.id),
                 lambda: beta.chat.completions.update(made.id, metadata={"run": "theirs"}),
                 lambda: beta.chat.completions.delete(made.id),
                 lambda: acme.chat.completions.retrieve(unkept.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert ids(beta.chat.completions.list(metadata={"run": run})) == []
    assert acme.chat.completions.retrieve(made.id).metadata == {"run": run}  # as it was
    deleted = acme.chat.completions.delete(made.id)
    assert (deleted.id, deleted.deleted, deleted.object) == \
        (made.id, True, "chat.completion.deleted")
    with pytest.raises(openai.NotFoundError) as gone:
        acme.chat.completions.retrieve(made.id)
    assert gone.value.body["message"] == f"Chat completion with id '{made.id}' not found."
    assert ids(acme.chat.completions.list(metadata={"run": run})) == []
    with pytest.raises(openai.BadRequestError) as untagged:  # metadata tags a stored one
        acme.chat.completions.create(messages=MESSAGES, metadata={"run": run}, **ASK)
    assert untagged.value.body["param"] == "metadata"
    metrics = httpx.get(f"{deployment.stack.base_url}/metrics", headers=OPERATOR,
                        timeout=30).text
    assert 'symbiosis_stored_chat_completions_total{kept="true",tenant="acme"}' in metrics
