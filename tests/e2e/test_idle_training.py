"""`symbiosis serve` on a CPU (idle training, the default there): the fine-tuning jobs run on the
executor's idle twin (`executor.twin`, at the lowest priority), while inference keeps the serving
executor; the job trains as it does on the one executor (it learns its answer) and is served by
the other."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import psutil
import pytest

from executor.priority import NICE
from executor.share import TWIN_HOLD_S
from tests.e2e.adapters import MODEL
from tests.e2e.conftest import OPERATOR_KEY, Deployment, sign_in
from tests.e2e.jobs import ANSWER, ask, create, memorization_file, start_stack, wait
from tests.e2e.test_metrics import scrape
from tests.helpers import calls_by_kind, priorities

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities: Linux's")]


def test_the_jobs_train_on_the_idle_twin_and_inference_on_the_serving_executor(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    stack = start_stack(tmp_path / "data")  # the default on a CPU executor of one shard
    try:
        env = stack.service_env()
        serving, training = env["SYMBIOSIS_EXECUTOR"], env["SYMBIOSIS_TRAINING_EXECUTOR"]
        assert training.endswith("/training-executor.sock") and training != serving
        executor = psutil.Process(stack.services["executor"].proc.pid)
        [twin] = executor.children()  # the executor's idle twin (`executor.twin`)
        assert priorities(twin.pid) == {(os.SCHED_BATCH, NICE)}
        assert (os.SCHED_BATCH, NICE) not in priorities(executor.pid)
        deployment = Deployment(stack, {})
        client = deployment.client("acme")
        upload = client.files.create(file=("memo.jsonl", memorization_file()),
                                     purpose="fine-tune")
        job = wait(client, create(client, upload.id), ("succeeded",))
        assert ask(client, job.fine_tuned_model) == ANSWER
        assert ask(client, MODEL) != ANSWER
        (twin_inference, twin_training), (inference, training_calls) = \
            calls_by_kind(training), calls_by_kind(serving)
        assert twin_inference == 0 and twin_training > 0
        assert inference > 0 and training_calls == 0
        assert priorities(twin.pid) == {(os.SCHED_BATCH, NICE)}
        assert metrics(deployment, twin_training) == {
            ("symbiosis_executor_calls_total", "training"): 0,
            ("symbiosis_training_executor_calls_total", "training"): twin_training,
            ("symbiosis_training_executor_calls_total", "inference"): 0}
        scraped = scrape(deployment)
        assert scraped[("symbiosis_training_executor_up", ())] == 1
        # the serving executor counts the twin's compute as training's (`executor.twin_ledger`)
        share = scraped[("symbiosis_executor_training_share", ())]
        assert 0 < share <= 1
        # the hold its inference batches put on the twin's training: the longest at twice the
        # floor, none at it (`TrainingShare.hold_at`)
        floor = scraped[("symbiosis_executor_training_share_floor", ())]
        margin = min(max((share - floor) / floor, 0.0), 1.0)
        assert scraped[("symbiosis_executor_twin_hold_seconds", ())] == pytest.approx(
            TWIN_HOLD_S * margin)
        assert scraped[("symbiosis_executor_twin_owed_batches_total", ())] >= 0
        assert ("symbiosis_training_executor_twin_hold_seconds", ()) not in scraped
        browser = request.getfixturevalue("browser")  # last: the rest needs no Chromium
        up, kinds, room = twin_in_the_dashboard(browser, deployment)
        assert (up, kinds) == ("up", {"training": twin_training})
        hold_ms = 1e3 * scraped[("symbiosis_executor_twin_hold_seconds", ())]
        owed = scraped[("symbiosis_executor_twin_owed_batches_total", ())]
        shown_share, shown_floor = (float(x) for x in re.fullmatch(
            r"([\d.]+) % \(([\d.]+) %\)", room[0]).groups())  # to one decimal
        assert shown_share == pytest.approx(100 * share, abs=0.051)
        assert shown_floor == pytest.approx(100 * floor, abs=0.051)
        assert float(room[1]) == pytest.approx(hold_ms, abs=0.051) and int(room[2]) == owed
    finally:
        stack.stop()
    assert not twin.is_running()


def metrics(deployment: Deployment, twin_training: int, timeout_s: float = 10.0) -> dict:
    """/metrics' call counts of both executors once the twin's training calls show there (the
    manager asks each executor for its figures every second)."""
    twin = ("symbiosis_training_executor_calls_total", "training")
    keys = (("symbiosis_executor_calls_total", "training"), twin,
            ("symbiosis_training_executor_calls_total", "inference"))
    deadline = time.monotonic() + timeout_s
    while True:
        scraped = scrape(deployment)
        counts = {(name, kind): scraped.get((name, (("kind", kind),))) for name, kind in keys}
        if counts[twin] == twin_training or time.monotonic() > deadline:
            return counts
        time.sleep(0.5)


def twin_in_the_dashboard(browser, deployment: Deployment) -> tuple[str, dict[str, int], tuple]:
    """The operator's dashboard, in a real browser: whether the twin is up, its calls by kind,
    those it ran, and the room the serving executor leaves it (training's share and floor, the
    hold, the inference batches owed to it)."""
    page = sign_in(browser, deployment, OPERATOR_KEY)
    page.wait_for_selector("#twin-kinds-table tr[data-kind]")
    rows = page.eval_on_selector_all(
        "#twin-kinds-table tr[data-kind]",
        "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
    up = page.text_content("#twin-up")
    room = tuple(page.text_content(f"#twin-{name}") for name in ("share", "hold", "owed"))
    page.close()
    return up, {kind: int(calls) for kind, calls, *_ in rows if int(calls)}, room
