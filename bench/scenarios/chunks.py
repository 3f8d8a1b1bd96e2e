"""Prompts of other lengths in one batch. Long prompts beside running sequences (15, issue 31:
inference first, end to end): 4
sequences decode in one worker's engine while prompts of 1,024 tokens arrive one at a time
(each 16 decode steps after the one before ended, `bench.longctx.QUIET_STEPS`), each prefilled
a chunk a step (`workers.inference.chunks`, sized from what the engine measures, as a worker
does by default) against each prefilled whole (the engine before chunks), and each chunk in the
running rows' decode forward (`workers.inference.packed`, by default) against in a forward of
its own beside it (the engine before packed steps). Each side's warm-up
serves one long prompt, so that the window sees a worker that has run a while: its process has
held a joined batch's cache before (`workers.inference.memory`).
Plain generate() has no continuous batching to compare with: an arrival there waits for the
running sequences to end. A prompt of that length alone, though, compares with one peft
process's forward over it: ours on a lone worker's share of the cores, plain on the run's
threads.

Rows of mixed lengths decoding together (16): one prompt of 1,024 tokens and 7 of 64 arrive
together and decode 64 tokens each, through one worker's engine with each row attending from its
own first position (`workers.inference.row_attention`, by default) against the same engine over
the padded width (an attention call counted too dear ever to split), and against one peft
process's generate() of the same batch, left-padded; decode steps only (the rounds' prefills
are left out), in windows of at least 20 s."""

from __future__ import annotations

from bench.group import GroupResult
from bench.records import Record
from bench.scenarios.common import Settings, run_ours, run_plain
from bench.scenarios.inference import decode_warmup

PROMPT = 1024
WHOLE = 10**9  # a chunk larger than any prompt: each prefilled whole
ROWS, SHORT, TOKENS = 8, 64, 64
LENGTHS_WINDOW_S = 20  # plain's left-padded prefill of 8 x 1,024 tokens alone takes ~6 s
PADDED = 10**15  # bytes an attention call is counted to cost: never split, the padded width


def long_prompts(settings: Settings) -> list[Record]:
    shape = {"kind": "beside", "method": "lora", "rank": 8, "running": 4,
             "prompt": 128 if settings.toy else PROMPT, "duration": settings.duration,
             "warmup": decode_warmup(settings)}
    chunked = run_ours(settings, [shape])
    whole = run_ours(settings, [{**shape, "chunk_tokens": WHOLE}])
    separate = run_ours(settings, [{**shape, "separate_forwards": True}])
    alone = {"kind": "prefill", "method": "lora", "rank": 8, "length": shape["prompt"],
             "duration": settings.duration, "warmup": shape["warmup"]}
    ours_alone, plain_alone = run_ours(settings, [alone]), run_plain(settings, [alone])
    name = f"15 prompts of {shape['prompt']} tokens beside 4 running sequences"
    versus = "prefilled a chunk a step vs whole"
    return [
        Record(f"15 a prompt of {shape['prompt']} tokens alone", "prefill forward, median, "
               "ours vs one peft process", ours_alone.latency_ms(0.5), plain_alone.latency_ms(0.5),
               "ms", higher_is_better=False),
        Record(name, f"gap between a running sequence's tokens, median, {versus}",
               chunked.latency_ms(0.5), whole.latency_ms(0.5), "ms", higher_is_better=False),
        Record(name, f"gap between a running sequence's tokens, p99, {versus}",
               chunked.latency_ms(0.99), whole.latency_ms(0.99), "ms", higher_is_better=False),
        *_against(name, versus, chunked, whole),
        *_against(name, "a chunk in the rows' decode forward vs in a forward of its own",
                  chunked, separate),
    ]


def _against(name: str, versus: str, ours: GroupResult, other: GroupResult) -> list[Record]:
    """The longest gap between a running sequence's tokens, their tokens/s and an arrival's
    time to first token, `ours` against `other`."""
    return [
        Record(name, f"gap between a running sequence's tokens, longest, {versus}",
               ours.latency_ms(1.0), other.latency_ms(1.0), "ms", higher_is_better=False),
        Record(name, f"running sequences' tokens/s, {versus}", ours.tokens_per_s(),
               other.tokens_per_s(), "tok/s"),
        Record(name, f"an arrival's time to first token, median, {versus}",
               ours.first_token_ms(0.5), other.first_token_ms(0.5), "ms",
               higher_is_better=False),
    ]


def mixed_lengths(settings: Settings) -> list[Record]:
    shape = {"kind": "lengths", "method": "lora", "rank": 8, "running": ROWS,
             "prompt": 256 if settings.toy else PROMPT, "length": SHORT, "tokens": TOKENS,
             "duration": settings.duration if settings.toy else max(settings.duration,
                                                                    LENGTHS_WINDOW_S),
             "warmup": decode_warmup(settings)}
    by_runs = run_ours(settings, [shape])
    padded = run_ours(settings, [{**shape, "attention_call_bytes": PADDED}])
    plain = run_plain(settings, [shape])
    name = f"16 mixed lengths: {ROWS} rows decoding together, prompts of 1 x " \
           f"{shape['prompt']} + {ROWS - 1} x {SHORT} tokens"
    step = "a decode step of all rows, median"
    return [
        Record(name, f"{step}, each row from its first position vs over the padded width "
               "(ours both)", by_runs.latency_ms(0.5), padded.latency_ms(0.5), "ms",
               higher_is_better=False),
        Record(name, f"{step}, ours vs one peft process's generate() (left-padded)",
               by_runs.latency_ms(0.5), plain.latency_ms(0.5), "ms", higher_is_better=False),
        Record(name, "decode tokens/s (rows / mean step), ours vs one peft process's "
               "generate()", 1e3 * ROWS / by_runs.latency_ms(), 1e3 * ROWS / plain.latency_ms(),
               "tok/s"),
    ]
