"""What a packed step teaches the chunk budget (`ChunkBudget`): its chunks' cost learned under
its own forward's threads, and nothing learned from a packed step whose forward failed."""

from __future__ import annotations

import torch
from transformers import AutoTokenizer

from catalogue.resolve import resolve_model
from executor.local import LocalExecutor
from tests.peft_reference import build_pair
from tests.workers.inference.test_chunks import prompt
from tests.workers.inference.test_packed import GREEDY, chunking, input_shapes
from wire import manager as W
from workers.inference.engine import InferenceEngine
from workers.inference.packed import Segment
from workers.inference.request import Request
from workers.threads import ForwardThreads


def recording(engine: InferenceEngine) -> tuple[list, list]:
    """(tokens, the threads it is learned under) of each prefill cost the engine's chunk
    budget learns from now on, and the seconds of each decode step's."""
    budget, prefills, decodes = engine.chunks.budget, [], []
    observe_prefill, observe_decode = budget.observe_prefill, budget.observe_decode

    def prefill(seconds: float, tokens: int, threads: int = 0) -> None:
        prefills.append((tokens, threads or torch.get_num_threads()))
        observe_prefill(seconds, tokens, threads)

    def decode(seconds: float) -> None:
        decodes.append(seconds)
        observe_decode(seconds)

    budget.observe_prefill, budget.observe_decode = prefill, decode
    return prefills, decodes


def test_a_packed_steps_cost_is_learned_on_its_own_forwards_threads(threads_back) -> None:
    """Rows beyond a KV budget decode offloaded, in a forward of their own after the packed
    one, each on the threads its tokens keep busy (`workers.threads`, a share of 2): a chunk of
    256 tokens beside a resident row on 2, the offloaded row's token on 1. The chunk's cost is
    learned under the packed forward's threads, not the last forward's."""
    _, ours = build_pair("tiny-llama", "lora", LocalExecutor.load("tiny-llama"))
    ForwardThreads(2).attach(ours.get_base_model())  # as the worker's models (worker.py)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))
    probe = InferenceEngine(ours.eval(), tokenizer, max_context=2048, eos_ids=())
    engine = InferenceEngine(ours, tokenizer, max_context=2048, eos_ids=(), chunk_tokens=256,
                             kv_budget_bytes=150 * probe.kv_token_bytes)
    learned, _ = recording(engine)
    engine.add(Request("resident", prompt(40), W.SamplingParams(max_tokens=30, temperature=0)))
    engine.step()
    engine.add(Request("offloaded", prompt(3, seed=1), GREEDY))
    engine.step()
    assert len(engine.resident.sequences) == len(engine.offloaded.sequences) == 1
    shapes = input_shapes(engine.decode_model)
    engine.add(Request("long", prompt(300, seed=2), GREEDY))
    learned.clear()
    engine.step()
    assert shapes == [(1, 1 + 256), (1, 1)]  # the packed forward, then the offloaded row's
    assert learned == [(256, 2)]


def test_a_packed_step_that_fails_teaches_only_its_chunk_alone(monkeypatch) -> None:
    """A 40-token prompt comes in by chunks of 16 beside a running row, the second chunk's
    packed forward failing in the first layer's attention: that step's chunk goes in a forward
    of its own, then the row decodes. Of that step the budget learns the lone chunk's cost and
    nothing else (neither the whole step's time as a packed step's chunk cost nor as a decode
    step's); the packed steps before and after it teach theirs, the next decode step its own."""
    _, _, engine = chunking()
    mask, failed = Segment.mask, []

    def failing(self: Segment, *args):
        if self.done == 16 and not failed:
            failed.append(self.done)
            raise RuntimeError("injected")
        return mask(self, *args)

    monkeypatch.setattr(Segment, "mask", failing)
    engine.add(Request("running", prompt(5), W.SamplingParams(max_tokens=20, temperature=0)))
    engine.step()
    engine.add(Request("long", prompt(40, seed=1), GREEDY))
    shapes = input_shapes(engine.decode_model)
    prefills, decodes = recording(engine)
    learned = []
    for _ in range(4):
        prefills.clear()
        decodes.clear()
        engine.step()
        learned.append((list(prefills), len(decodes)))
    threads = torch.get_num_threads()
    assert failed == [16]
    assert shapes == [(1, 17), (1, 17), (1, 16), (1, 1), (1, 9), (2, 1)]
    assert learned == [([(16, threads)], 0), ([(16, threads)], 0), ([(8, threads)], 0), ([], 1)]
