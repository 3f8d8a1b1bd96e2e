"""One benchmark client: a model with its own adapter running one workload, either side.

    python -m bench.workload --side ours|plain --model M [--endpoint E]
        --kind decode|prefill|train|chat|long|beside|lengths|calls --sync-dir D --index I
        [--duration S]
        [--device cuda --dtype bfloat16] ...

`ours` is a remote model on the shared executor; `plain` is transformers + peft with its own copy
of the weights (the baseline). The client builds its model, writes D/I.ready, waits for D/go,
runs for the duration and writes its measurements to D/I.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench.kinds import KINDS, TRAINING_KINDS
from bench.loops import Window, calls, decode, decode_mixed, prefill, train, train_chat
from bench.models import RANKS, build, build_mixed
from bench.paced import PacedTokens
from bench.sides import wait_policy
from wire.jobs import DEFAULT_MAX_SEQ_LENGTH
from workers.inference.memory import keep_freed

CHAT_DATA = Path(__file__).parents[1] / "tests" / "data" / "gsm8k_train_chat_1000.jsonl"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.workload")
    p.add_argument("--side", choices=["ours", "plain"], default="ours")
    p.add_argument("--endpoint")
    p.add_argument("--model", required=True)
    p.add_argument("--kind", choices=KINDS, required=True,
                   help="chat: train on GSM8K's chat file, --batch examples a step; dpo: DPO "
                   "on pairs made from it, --batch pairs a step (bench.preference); long: "
                   "long-context decode, --prompt tokens of context; "
                   "beside (ours): --running sequences decode while prompts of --prompt tokens "
                   "keep arriving; lengths: --running sequences decode together, one prompt of "
                   "--prompt tokens, the others of --length")
    p.add_argument("--layer", default="layers.0.self_attn.o_proj",
                   help="calls: the layer called (a name suffix)")
    p.add_argument("--method", default="lora")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--privacy", action="store_true")
    p.add_argument("--free-base", action="store_true",
                   help="plain only: frozen linear layers cost nothing (bench.ceiling)")
    p.add_argument("--recompute", action="store_true",
                   help="train: recompute each decoder layer in the backward (either side)")
    p.add_argument("--adapters", type=int, default=0,
                   help="decode: this many LoRA adapters in one process, a request each at "
                        "once (plain: one peft model's mixed batches; ours: a shared worker)")
    p.add_argument("--sync-dir", type=Path, required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--duration", type=float, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--history", type=int, default=0,
                   help="dpo: each pair's conversation opens with this many earlier exchanges "
                        "of the file (a multi-turn chat)")
    p.add_argument("--device", default="cpu", help="where the client runs its part")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--warmup", type=float, default=0,
                   help="seconds of the same work before the barrier (kernels, allocator); "
                        "train: at least one step")
    p.add_argument("--min-units", type=int, default=0,
                   help="train: at least this many steps in the window, however long they take")
    p.add_argument("--held", action="store_true",
                   help="decode: past --duration, until the group's other clients are done")
    p.add_argument("--decode-target-ms", type=float, default=0,
                   help="ours: this client's decode steps' target in the executor, as a "
                        "tenant's `decode_target_ms` (0: the executor's own)")
    p.add_argument("--inter-token-target-ms", type=float, default=0,
                   help="decode, ours: this client's target between tokens, as a tenant's "
                        "`inter_token_target_ms` (its decode waits follow, bench.paced)")
    p.add_argument("--kv-budget-mb", type=float, default=0,
                   help="long, ours: the KV cache kept on the device (0: no limit)")
    p.add_argument("--running", type=int, default=4, help="beside: sequences decoding")
    p.add_argument("--chunk-tokens", type=int, default=0,
                   help="beside: a step's prompt tokens beside running sequences, as a worker's "
                        "`prefill_chunk_tokens` (0: sized from what the engine measures)")
    p.add_argument("--separate-forwards", action="store_true",
                   help="beside, ours: chunks in forwards of their own beside the rows' decode "
                        "step (the engine before packed steps)")
    p.add_argument("--attention-call-bytes", type=int,
                   help="lengths, ours: what the engine counts an attention call to cost "
                        "(default: `row_attention.call_bytes`, as a worker's)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.held and (args.kind != "decode" or args.adapters):
        raise SystemExit("--held: a decode client of one adapter only")
    training = args.kind in TRAINING_KINDS
    if training and args.side == "ours":
        from workers.training.process import run_as_trainer

        run_as_trainer()  # as the spawner's trainers do
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if args.kind == "calls":
        model = None
    elif args.adapters and args.side == "ours":
        from bench.shared_worker import SharedWorker

        model = SharedWorker(args.model, args.endpoint, args.adapters,
                             args.sync_dir / f"adapters-{args.index}", args.device)
    elif args.adapters:
        ranks = [RANKS[i % len(RANKS)] for i in range(args.adapters)]
        model = build_mixed(args.model, ranks, args.device, dtype)
    else:
        model = build(args.side, args.model, args.endpoint, args.method, args.rank, args.index,
                      args.privacy, training=training, free_base=args.free_base,
                      device=args.device, dtype=dtype, recompute=args.recompute)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    handle = getattr(base, "symbiosis_executor", None)
    if args.decode_target_ms or args.inter_token_target_ms:
        from wire.call.messages import CallTargets
        from workers.remote.client import ExecutorClient

        if not isinstance(handle, ExecutorClient):
            raise SystemExit("latency targets: ours only, without --privacy")
        handle.targets = CallTargets.from_ms(args.decode_target_ms)  # as a worker's engine sets
    paced = PacedTokens(handle, args.inter_token_target_ms) if args.inter_token_target_ms \
        else None
    engines = args.side == "ours" and args.kind in ("long", "beside", "lengths")
    tokenizer = _tokenizer(args.model) if engines or args.kind in ("chat", "dpo") else None
    pairs = None
    if args.kind == "dpo":  # the pairs' references before the window, as a job's
        from bench.preference import preference_pairs

        pairs = preference_pairs(model, tokenizer, CHAT_DATA, _pad(tokenizer),
                                 DEFAULT_MAX_SEQ_LENGTH, history=args.history)
    if engines or (args.side == "ours" and args.adapters):
        keep_freed()  # these run a worker's engine: its process keeps freed memory, as a worker
    rng = torch.Generator().manual_seed(args.index)
    if args.warmup:
        _work(args, model, tokenizer, time.monotonic() + args.warmup, rng, paced, warm=True,
              pairs=pairs)
    sync: Path = args.sync_dir
    (sync / f"{args.index}.ready").touch()
    while not (sync / "go").exists():
        time.sleep(0.01)
    calls_before = getattr(handle, "calls", 0)  # the warm-up's are not the window's
    started, cpu_started = time.monotonic(), time.process_time()
    until = started + args.duration
    latencies, done, per_unit, extra = _work(args, model, tokenizer, until, rng, paced,
                                             pairs=pairs)
    made = getattr(handle, "calls", None)
    result = {"kind": args.kind, "method": args.method, "rank": args.rank,
              "latencies": latencies, "tokens_per_unit": per_unit,
              "executor_calls": None if made is None else made - calls_before,
              "elapsed": done - started,  # to the last completed unit of work
              "started": started,  # time.monotonic(): one clock for the group's processes
              "cpu_s": time.process_time() - cpu_started,
              "decode_target_ms": args.decode_target_ms,
              "inter_token_target_ms": args.inter_token_target_ms,
              "omp_wait_policy": wait_policy(),  # as torch loaded it (None: the default)
              **extra}
    (sync / f"{args.index}.json").write_text(json.dumps(result))
    return 0


def _work(args: argparse.Namespace, model, tokenizer, until: float, rng: torch.Generator,
          paced: PacedTokens | None = None,
          warm: bool = False, pairs: list | None = None
          ) -> tuple[list[float], float, int, dict]:
    """Run the client's kind of work until the window closes: (each unit's latency, when the
    last unit ended, tokens per unit, what else the kind reports). `warm`: the warm-up's;
    `pairs`: a DPO client's, with their references (`bench.preference`)."""
    if args.kind == "calls":
        latencies, done, per_unit = calls(args.endpoint, args.layer, until)
        return latencies, done, per_unit, {}
    if args.kind == "decode" and args.adapters and args.side == "ours":
        return (*model.decode(args.prompt, args.tokens, until, rng), 1, {})
    if args.kind == "decode" and args.adapters:
        return (*decode_mixed(model, args.adapters, args.prompt, args.tokens, until, rng), 1, {})
    if args.kind == "decode":
        window = Window(until, args.sync_dir / "release" if args.held and not warm else None)
        latencies, done, firsts = decode(model, args.prompt, args.tokens, window, rng,
                                         paced=paced)
        return latencies, done, 1, {"first_tokens": firsts}
    if args.kind == "prefill":
        return (*prefill(model, args.length, until, rng), args.length, {})
    if args.kind == "long":
        from bench import longctx

        if args.side == "plain":  # generate(): the gaps after each prefill
            return (*decode(model, args.prompt, args.tokens, until, rng, first=False)[:2], 1, {})
        budget = int(args.kv_budget_mb * 2**20)
        gaps, done, offloaded = longctx.engine_rounds(model, tokenizer, args.prompt,
                                                      args.tokens, until, rng, budget)
        return gaps, done, 1, {"offloaded_rows": offloaded}
    if args.kind == "beside":
        from bench import longctx

        gaps, done, extra = longctx.beside_rounds(model, tokenizer, args.prompt, args.running,
                                                  until, rng, args.chunk_tokens,
                                                  served=1 if warm else 0,
                                                  pack=not args.separate_forwards)
        return gaps, done, args.running, extra
    if args.kind == "lengths":
        from bench import longctx

        prompts = longctx.mixed_prompts(args.prompt, args.length, args.running, rng)
        if args.side == "plain":
            return (*longctx.padded_rounds(model, prompts, args.tokens, until), args.running, {})
        return (*longctx.lengths_rounds(model, tokenizer, prompts, args.tokens, until,
                                        args.attention_call_bytes), args.running, {})
    if args.kind == "chat":
        from workers.training.data import load_examples

        examples = load_examples(CHAT_DATA, tokenizer, DEFAULT_MAX_SEQ_LENGTH)  # a job's
        return (*train_chat(model, examples, _pad(tokenizer), args.batch, until), {})
    if args.kind == "dpo":
        from bench.preference import train_pairs

        return (*train_pairs(model, pairs, _pad(tokenizer), args.batch, until,
                             share_prompt=args.side == "ours"), {})
    least = 1 if warm else args.min_units
    return (*train(model, args.batch, args.length, until, rng, least), args.batch * args.length,
            {})


def _pad(tokenizer) -> int:
    """The padding id, as a trainer pads."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id


def _tokenizer(model: str):
    from transformers import AutoTokenizer

    from catalogue.resolve import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(model))


if __name__ == "__main__":
    raise SystemExit(main())
