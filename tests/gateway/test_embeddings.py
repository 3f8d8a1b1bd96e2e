"""The embeddings endpoint's answer in the gateway (its worker a stand-in answering each input
with a vector of a large model's size): the numbers are the worker's float32 values, as floats
or base64, and an answer of megabytes is sent as it is rendered, by worker threads a piece of
embeddings at a time (json.dumps holds the GIL throughout), so the event loop goes on answering
meanwhile and the gateway never holds the whole text."""

from __future__ import annotations

import asyncio
import base64
import json
import struct

from gateway.routes import embeddings
from gateway.settings import GatewaySettings
from tests.gateway.conftest import KEY, serving
from wire import manager as W

DIMENSIONS = 4096


def vector(seed: int) -> list[float]:
    return [struct.unpack("<f", struct.pack("<f", ((seed * 7919 + k) % 1000) / 997))[0]
            for k in range(DIMENSIONS)]


def answer(message: W.Generate) -> list[W.Message]:
    """One input's events as a worker sends them: its tokens, its embedding."""
    seed = int(message.id.rsplit("-", 1)[1])
    return [W.Started(message.id, 3), W.Done(message.id, 3, 0, embedding=struct.pack(
        f"<{DIMENSIONS}f", *vector(seed)))]


def test_the_numbers_are_the_workers_rendered_piecewise_off_the_event_loop(tmp_path,
                                                                     monkeypatch) -> None:
    where: list[str] = []
    dumps = embeddings.dumps

    def watched(value: dict) -> bytes:
        try:
            asyncio.get_running_loop()
            where.append("event loop")
        except RuntimeError:
            where.append("worker thread")
        return dumps(value)

    monkeypatch.setattr(embeddings, "dumps", watched)
    settings = GatewaySettings(data_dir=tmp_path, api_keys="acme=sk-acme",
                               manager=f"ipc://{tmp_path}/manager.sock")
    with serving(settings) as (client, manager):
        manager.answer = answer
        floats = client.post("/v1/embeddings", headers=KEY, json={
            "model": "tiny-llama", "input": ["a", "b", "c"], "encoding_format": "float"})
        assert where == ["worker thread"] * 4  # each embedding, then the list's other fields
        packed = client.post("/v1/embeddings", headers=KEY, json={
            "model": "tiny-llama", "input": [[1, 2, 3], [4, 5, 6]], "encoding_format": "base64"})
    assert floats.status_code == 200, floats.text
    assert "content-length" not in floats.headers  # sent as it is rendered
    made = floats.json()
    assert [e["embedding"] for e in made["data"]] == [vector(i) for i in range(3)]
    assert [e["index"] for e in made["data"]] == [0, 1, 2]
    assert made["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    assert made["object"] == "list" and made["model"] == "tiny-llama"
    assert [list(struct.unpack(f"<{DIMENSIONS}f", base64.b64decode(e["embedding"])))
            for e in packed.json()["data"]] == [vector(0), vector(1)]


def test_a_long_list_goes_a_piece_of_embeddings_at_a_time() -> None:
    count = 2 * embeddings.PIECE + 3
    vectors = [struct.pack("<2f", k, -k / 3) for k in range(count)]
    content = {"object": "list", "data": list(enumerate(vectors)), "model": "m",
               "usage": {"prompt_tokens": 1, "total_tokens": 1}}
    parts = list(embeddings.pieces(content, "float"))
    assert len(parts) == 4  # three pieces of embeddings, then the list's other fields
    assert json.loads(b"".join(parts)) == {
        "data": [{"object": "embedding", "index": k,
                  "embedding": list(struct.unpack("<2f", vectors[k]))} for k in range(count)],
        "object": "list", "model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1}}
