"""The benchmark client's accounting: a decode client stops when its window closes and counts
every token it generated; throughput is each client's work over its own window."""

import json
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.group import GroupResult
from bench.loops import HELD_MAX_S, TokenClock, Window, decode
from bench.scenarios.inference import first_token_spread
from catalogue.resolve import resolve_model


def _model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(resolve_model("tiny-llama")).eval()


def test_token_clock_counts_each_token_and_stops_at_the_window() -> None:
    model, ids = _model(), torch.tensor([[1, 2, 3, 4]])
    open_window = TokenClock(until=time.monotonic() + 600)
    gaps = open_window.generate(model, ids, tokens=6)
    assert len(gaps) == 6 and all(g > 0 for g in gaps)
    closed = TokenClock(until=time.monotonic())  # already over: stops after one token
    assert len(closed.generate(model, ids, tokens=6)) == 1

    # transformers ands the verdict with a tensor on the ids' device: a CPU verdict beside CUDA
    # ids crashed every GPU decode client on first contact (H200, 2026-11-26)
    verdict = TokenClock(until=0.0)(torch.zeros(2, 3, dtype=torch.long, device="meta"), None)
    assert verdict.device.type == "meta" and verdict.shape == (2,)


def test_decode_ends_with_the_window_not_with_its_last_generate() -> None:
    model, rng = _model(), torch.Generator().manual_seed(0)
    started = time.monotonic()
    latencies, last, firsts = decode(model, prompt=4, tokens=10_000, until=started + 1.0,
                                     rng=rng)
    assert started + 1.0 <= last < started + 3.0  # a 10,000-token generate was cut short
    assert len(latencies) > 1 and abs(sum(latencies) - (last - started)) < 0.05
    assert firsts == latencies[:1]  # one generate: its first token's wait


def test_time_to_first_token_is_a_quantile_of_decode_clients_first_waits() -> None:
    result = GroupResult([
        {"kind": "decode", "latencies": [], "tokens_per_unit": 1, "elapsed": 1.0,
         "first_tokens": [0.01 * i for i in range(1, 101)]},
        {"kind": "train", "latencies": [1.0], "tokens_per_unit": 256, "elapsed": 1.0}],
        peak_pss=0, setup_s=0.0)
    assert result.first_token_ms(0.99) == pytest.approx(990.1)  # between the 99th and 100th
    assert result.first_token_ms(0.5) == pytest.approx(505.0)


def test_a_first_token_quantile_names_its_samples_and_the_quantiles_below_it() -> None:
    def firsts(seconds: list[float]) -> GroupResult:
        return GroupResult([{"kind": "decode", "latencies": [], "tokens_per_unit": 1,
                             "elapsed": 1.0, "first_tokens": seconds}], peak_pss=0, setup_s=0.0)

    beside, alone = firsts([0.2] * 79 + [0.9]), firsts([0.1, 0.3, 0.3, 0.5])
    assert beside.first_token_ms(0.99) == pytest.approx(347.0)  # of 80: not one outlier alone
    assert first_token_spread(beside, alone) == \
        "of 80 / 4 first tokens; p50 200 / 300 ms, p90 200 / 440 ms"


def test_throughput_is_each_clients_work_over_its_own_window() -> None:
    result = GroupResult([
        {"kind": "decode", "latencies": [0.1] * 10, "tokens_per_unit": 1, "elapsed": 2.0},
        {"kind": "decode", "latencies": [0.1] * 30, "tokens_per_unit": 1, "elapsed": 3.0},
        {"kind": "train", "latencies": [1.0] * 2, "tokens_per_unit": 256, "elapsed": 4.0},
    ], peak_pss=0, setup_s=0.0)
    assert result.tokens_per_s("decode") == 10 / 2.0 + 30 / 3.0
    assert result.tokens_per_s("train") == 2 * 256 / 4.0
    assert result.tokens_per_s() == 15.0 + 128.0


def test_long_context_rounds_offload_the_cache_past_the_budget_only() -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer

    from bench.longctx import engine_rounds
    from executor.local import LocalExecutor
    from workers.remote.build import remote_model

    model = get_peft_model(remote_model("tiny-llama", LocalExecutor.load("tiny-llama")),
                           LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj"]))
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))
    for budget, offloaded in ((0, False), (1, True)):
        rng = torch.Generator().manual_seed(0)
        started = time.monotonic()
        gaps, last, rows = engine_rounds(model, tokenizer, context=40, tokens=6,
                                         until=started + 1.0, rng=rng, kv_budget_bytes=budget)
        assert bool(rows) is offloaded  # (a first round cut by the window has fewer gaps)
        assert gaps and all(g > 0 for g in gaps) and last >= started + 1.0
        # a round's first step prefills and decodes (2 tokens); each later one decodes one token
        assert len(gaps) >= 6 - 2


def test_a_forked_client_that_fails_says_why_before_it_exits(tmp_path) -> None:
    """The preloaded parent's child ends with os._exit: its traceback must reach stderr first
    (on the first GPU run it did not, and a crash read only "exited before it was ready")."""
    import json
    import subprocess
    import sys

    argv = ["--model", "no-such-model", "--kind", "decode", "--sync-dir", str(tmp_path),
            "--index", "0"]
    run = subprocess.run([sys.executable, "-m", "bench.forked"], capture_output=True, text=True,
                         input=json.dumps({"argvs": [argv]}) + "\n", timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.splitlines()[-1]) == {"failed": 1}
    assert "Traceback (most recent call last)" in run.stderr and "no-such-model" in run.stderr


def _decode_against(endpoint: str, sync_dir, *flags: str) -> tuple[int, int, dict]:
    """One ours decode client run to its end with `flags`: the executor's decode lane's calls
    and those that met their target meanwhile, and the client's result."""
    import subprocess
    import sys

    from workers.remote.client import ExecutorClient

    probe = ExecutorClient(endpoint, name="targets-probe")
    try:
        before = probe.stats().lanes["decode"]
        (sync_dir / "go").touch()
        run = subprocess.run(
            [sys.executable, "-m", "bench.workload", "--side", "ours", "--model", "tiny-llama",
             "--endpoint", endpoint, "--kind", "decode", "--sync-dir", str(sync_dir),
             "--index", "0", *flags], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        after = probe.stats().lanes["decode"]
    finally:
        probe.close()
    result = json.loads((sync_dir / "0.json").read_text())
    return after.calls - before.calls, after.met - before.met, result


@pytest.mark.parametrize(("target_ms", "all_met"), [(0.001, False), (60_000, True)])
def test_a_client_asking_a_decode_target_carries_it_to_the_executor(
        executor_for, tmp_path, target_ms: float, all_met: bool) -> None:
    """`--decode-target-ms` (the 6c scenario's tenant): the executor counts the client's decode
    calls against it: a microsecond, none met; a minute, all."""
    calls, met, _ = _decode_against(executor_for("tiny-llama").endpoint, tmp_path, "--duration",
                                    "0.5", "--tokens", "4", "--decode-target-ms", str(target_ms))
    assert calls >= 5 and met == (calls if all_met else 0)


def test_a_client_asking_a_target_between_tokens_paces_its_decode_calls(executor_for,
                                                                       tmp_path) -> None:
    """`--inter-token-target-ms` (the 6d scenario's tenant), a microsecond: the client's first
    two forwards carry the executor's own wait (nothing measured yet; tiny-llama's make 7
    calls), every later call 1 us, which none meets; unpaced, a lone client's calls meet the
    executor's own 1 ms but for a busy host's few."""
    calls, met, result = _decode_against(executor_for("tiny-llama").endpoint, tmp_path,
                                         "--duration", "3", "--tokens", "8",
                                         "--inter-token-target-ms", "0.001")
    assert result["inter_token_target_ms"] == 0.001
    assert len(result["latencies"]) >= 20 and calls >= 70  # a token is ~2.4 calls here
    assert met * 10 <= calls  # the first two forwards' calls at most


def test_a_warm_up_beside_running_sequences_serves_a_long_prompt_past_its_window() -> None:
    """bench 15's warm-up: the window sees a process that has joined a long prompt's cache to
    the running rows before; a measured window stops when it closes."""
    from transformers import AutoTokenizer

    from bench.longctx import QUIET_STEPS, beside_rounds

    model, rng = _model(), torch.Generator().manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))
    gaps, _, extra = beside_rounds(model, tokenizer, prompt=64, running=2,
                                   until=time.monotonic(), rng=rng, chunk_tokens=16, served=1)
    assert len(extra["first_tokens"]) == 1  # one prompt served, though the window had closed
    assert len(gaps) == QUIET_STEPS + 64 // 16  # its quiet steps, then its 4 chunks
    gaps, _, extra = beside_rounds(model, tokenizer, prompt=64, running=2,
                                   until=time.monotonic(), rng=rng, chunk_tokens=16)
    assert gaps == [] and extra["first_tokens"] == []


def test_rows_of_mixed_lengths_decode_until_the_window_closes_on_either_side() -> None:
    """bench 16: one prompt of 40 tokens and 3 of 5 decode together, through a worker's engine
    (each row from its own first position, or over the padded width) and plain generate()
    (left-padded): each side's gaps are its decode steps only, up to the window's end."""
    from transformers import AutoTokenizer

    from bench.longctx import lengths_rounds, mixed_prompts, padded_rounds

    model = _model()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny-llama"))
    prompts = mixed_prompts(40, 5, 4, torch.Generator().manual_seed(0))
    assert [len(p) for p in prompts] == [40, 5, 5, 5]
    window = 1.0  # a first round cut by it has fewer gaps: ~50 ms a round alone, 0.3 s seen in CI
    for call_bytes in (0, 10**15):
        started = time.monotonic()
        gaps, last = lengths_rounds(model, tokenizer, prompts, tokens=6, until=started + window,
                                    call_bytes=call_bytes)
        assert len(gaps) >= 6 - 2 and all(g > 0 for g in gaps) and last >= started + window
    started = time.monotonic()
    gaps, last = padded_rounds(model, prompts, tokens=6, until=started + window)
    assert len(gaps) >= 6 - 1 and all(g > 0 for g in gaps) and last >= started + window


def test_a_training_window_takes_at_least_its_steps_and_a_warm_up_one() -> None:
    """A window too short for a step still counts `--min-units` of them (8 jobs of 2 x 128
    made about one each in a quick window), and a warm-up makes one whatever its seconds."""
    from bench.workload import _work, parser

    model = _model()
    for min_units, warm, steps in ((0, False, 0), (3, False, 3), (0, True, 1), (3, True, 1)):
        args = parser().parse_args(["--kind", "train", "--side", "plain", "--model",
                                    "tiny-llama", "--sync-dir", ".", "--index", "0",
                                    "--batch", "1", "--length", "8",
                                    "--min-units", str(min_units)])
        rng, started = torch.Generator().manual_seed(0), time.monotonic()
        latencies, done, per_unit, _ = _work(args, model, None, started - 1, rng, warm=warm)
        assert len(latencies) == steps and per_unit == 8 and done >= started
        assert all(seconds > 0 for seconds in latencies)


def test_a_held_window_closes_once_released_after_its_time(tmp_path) -> None:
    release = tmp_path / "release"
    held, plain = Window(100.0, release), Window(100.0)
    assert not held.closed(99.9) and not plain.closed(99.9)
    assert plain.closed(100.0) and not held.closed(100.0) and not held.closed(100 + HELD_MAX_S / 2)
    assert held.closed(100.0 + HELD_MAX_S)  # a group that never releases it: at last
    release.touch()
    assert not held.closed(99.9) and held.closed(100.0)
