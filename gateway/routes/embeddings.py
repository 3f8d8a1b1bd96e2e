"""POST /v1/embeddings: each input's embedding from the model it names (the base model, or an
adapter of the tenant's: its last token's final hidden state through the adapter, of length
1), through the same limits, workers and batching as a completion's prompts."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from gateway.deps import TenantDep
from gateway.errors import APIError, documented
from gateway.generation import Call, generate
from gateway.prompts import prompt_specs
from gateway.serving import PromptResult
from openapi.embeddings import EmbeddingList, EmbeddingRequest
from wire import manager as W

PIECE = 16  # embeddings rendered at a time: the encoder holds the GIL while it runs
router = APIRouter(prefix="/v1", tags=["embeddings"], responses=documented(400, 404, 409, 429))


@router.post("/embeddings", response_model=EmbeddingList)
async def create_embeddings(body: EmbeddingRequest, request: Request, tenant: TenantDep):
    state = request.app.state
    target = state.serving.resolve(tenant, body.model, body.user)
    hidden = state.text_tokens.hidden_size
    if body.dimensions and hidden and body.dimensions > hidden:
        raise APIError(400, f"dimensions is {body.dimensions}: this model's embeddings have "
                       f"{hidden}.", "invalid_value", "dimensions")
    prompts = prompt_specs(body.input, state.text_tokens.vocab_size, "input")
    params = W.SamplingParams(max_tokens=0, embed=True, dimensions=body.dimensions or 0)

    def make_body(call: Call, results: list[PromptResult]) -> dict:
        """`EmbeddingList`'s fields, each embedding as the worker's bytes (encoded as sent)."""
        tokens = sum(r.started.prompt_tokens for r in results)
        return {"object": "list", "data": [(r.index, r.done.embedding if r.done else b"")
                                           for r in results], "model": body.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    return await generate(request, tenant, target, prompts, params, prefix="emb-",
                          stream=False, include_usage=False, body=make_body,
                          chunks=lambda call, result, event: [],
                          usage_chunk=lambda call, results: {}, user=body.user,
                          respond=lambda made, headers: EmbeddingsJSON(
                              made, headers, body.encoding_format))


class EmbeddingsJSON(StreamingResponse):
    """An embedding list sent as it is rendered, by worker threads, `PIECE` embeddings at a
    time, each encoded only then. Rendered whole, 2,048 x 2,048 floats held the event loop for
    1.7 s (json.dumps holds the GIL, even in a thread) and the gateway's memory for ~300 MB (the
    floats as Python objects, their text, joined); piecewise, it holds the vectors' bytes and a
    piece."""

    def __init__(self, content: dict, headers: dict[str, str], encoding_format: str) -> None:
        super().__init__(pieces(content, encoding_format), headers=headers,
                         media_type="application/json")


def pieces(content: dict, encoding_format: str) -> Iterator[bytes]:
    """`content` as JSON (its `data` first), `PIECE` embeddings a piece."""
    data, opening = content["data"], b'{"data":['
    for start in range(0, len(data), PIECE):
        items = [dumps({"object": "embedding", "index": index,
                        "embedding": encoded(vector, encoding_format)})
                 for index, vector in data[start:start + PIECE]]
        yield opening + b",".join(items)
        opening = b","
    if opening != b",":
        yield opening
    yield b"]," + dumps({k: v for k, v in content.items() if k != "data"})[1:]


def dumps(value: dict) -> bytes:
    """Compact JSON in UTF-8, as starlette's JSONResponse renders (msgspec's encoder: json.dumps
    took ten times as long for a vector's floats)."""
    return msgspec.json.encode(value)


def encoded(vector: bytes, encoding_format: str) -> list[float] | str:
    """float32 little-endian bytes as OpenAI sends them: numbers, or those bytes in base64."""
    if encoding_format == "base64":
        return base64.b64encode(vector).decode()
    return list(struct.unpack(f"<{len(vector) // 4}f", vector))
