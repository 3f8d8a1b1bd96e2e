"""Versions on a real stack: promote and roll back under continuous traffic without losing a
request (each response names its version and equals plain peft's output for that version), a
stream in flight finishes on its version, a 90/10 split over 1,000 requests, sticky users, and
metrics by model and version."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from state.versions import choose
from tests.e2e.adapters import Reference, save_adapter
from tests.e2e.conftest import KEYS, OPERATOR, Deployment

pytestmark = pytest.mark.slow
PROMPT = "The quick brown fox"
HEADER = "x-symbiosis-model-version"
STREAMED = 1000  # tokens: still generating (> 10 s) when the promote and rollback come


def upload(deployment: Deployment, name: str, directory: Path, promote: bool) -> int:
    files = {"adapter_config": ("adapter_config.json",
                                (directory / "adapter_config.json").read_bytes()),
             "adapter_model": ("adapter_model.safetensors",
                               (directory / "adapter_model.safetensors").read_bytes())}
    created = httpx.post(f"{deployment.stack.base_url}/v1/adapters", files=files,
                         data={"name": name, "promote": str(promote).lower()},
                         headers={"Authorization": f"Bearer {KEYS['acme']}"})
    assert created.status_code == 201, created.text
    return created.json()["version"]


def lifecycle(deployment: Deployment, model: str, action: str, **body) -> dict:
    response = httpx.post(f"{deployment.stack.base_url}/v1/adapters/{model}/{action}",
                          json=body, headers={"Authorization": f"Bearer {KEYS['acme']}"})
    assert response.status_code == 200, response.text
    return response.json()


def expected_texts(directories: list[Path], max_tokens: int) -> dict[str, str]:
    texts = {}
    for number, directory in enumerate(directories, start=1):
        reference = Reference(directory)
        texts[str(number)] = reference.text(reference.greedy(reference.ids(PROMPT), max_tokens))
    return texts


def test_promote_and_rollback_under_traffic_lose_nothing(deployment, tmp_path) -> None:
    directories = [save_adapter(tmp_path / f"v{seed}", "lora", seed) for seed in (21, 22)]
    assert upload(deployment, "live", directories[0], True) == 1
    assert upload(deployment, "live", directories[1], False) == 2
    expected = expected_texts(directories, 4)
    assert expected["1"] != expected["2"]
    client = deployment.client("acme")
    stream = client.completions.create(model="acme/live", prompt=PROMPT, max_tokens=STREAMED,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    assert stream.response.headers[HEADER] == "acme/live@1"
    chunks = iter(stream)
    next(chunks)
    answers: list[tuple[float, str, str]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                raw = client.completions.with_raw_response.create(
                    model="acme/live", prompt=PROMPT, max_tokens=4, temperature=0)
                answers.append((started, raw.headers[HEADER], raw.parse().choices[0].text))
            except BaseException as exc:  # every failure is a lost request
                errors.append(exc)

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(2)
    lifecycle(deployment, "acme/live", "promote", version=2)
    promoted = time.monotonic()
    time.sleep(3)
    rolling_back = time.monotonic()
    assert lifecycle(deployment, "acme/live", "rollback")["serving"] == [
        {"version": 1, "weight": 100}]
    rolled_back = time.monotonic()
    time.sleep(2)
    stop.set()
    for thread in threads:
        thread.join()
    rest = list(chunks)

    assert not errors, errors[:3]
    # the stream in flight through both changes ends whole, on the version it started with
    assert rest[-1].usage.completion_tokens == STREAMED, rest[-1]
    for started, version_id, text in answers:
        name, _, number = version_id.partition("@")
        assert name == "acme/live" and text == expected[number], (version_id, text)
        if promoted < started < rolling_back:
            assert number == "2"
        if started > rolled_back:
            assert number == "1"
    seen = [v for _, v, _ in answers]
    assert seen.count("acme/live@2") >= 3 and seen[-1] == "acme/live@1", seen


def responses_by_version(deployment: Deployment, model: str) -> dict[str, float]:
    text = httpx.get(f"{deployment.stack.base_url}/metrics", headers=OPERATOR).text
    return {s.labels["version"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "symbiosis_responses_total" and s.labels.get("model") == model}


def test_a_split_follows_its_weights_and_keeps_users_on_one_version(deployment,
                                                                    tmp_path) -> None:
    for seed in (31, 32):
        upload(deployment, "ab", save_adapter(tmp_path / f"v{seed}", "lora", seed), seed == 31)
    split = [[1, 90], [2, 10]]
    lifecycle(deployment, "acme/ab", "split",
              weights=[{"version": n, "weight": w} for n, w in split])
    client = deployment.client("acme")
    before = responses_by_version(deployment, "acme/ab")

    def ask(user: str | None) -> str:
        raw = client.completions.with_raw_response.create(
            model="acme/ab", prompt="Hi", max_tokens=1, **({"user": user} if user else {}))
        return raw.headers[HEADER]

    with ThreadPoolExecutor(8) as pool:
        anonymous = list(pool.map(ask, [None] * 1000))
        users = [f"user-{i}" for i in range(40)] * 3
        sticky = list(pool.map(ask, users))
    assert set(anonymous) == {"acme/ab@1", "acme/ab@2"}
    bound = 4 * math.sqrt(1000 * 0.1 * 0.9)  # four standard deviations of a binomial
    assert abs(anonymous.count("acme/ab@2") - 100) < bound, anonymous.count("acme/ab@2")
    for user, version_id in zip(users, sticky, strict=True):
        assert version_id == f"acme/ab@{choose('acme/ab', split, user)}", user
    after = responses_by_version(deployment, "acme/ab")
    moved = {v: after.get(v, 0) - before.get(v, 0) for v in ("1", "2")}
    counted = [*anonymous, *sticky]
    assert moved == {"1": counted.count("acme/ab@1"), "2": counted.count("acme/ab@2")}


def test_a_version_that_does_not_load_never_serves(deployment: Deployment, tmp_path) -> None:
    """A file that passes every check of its own but that peft cannot load (a config value of
    the wrong type): the registration says why, nothing is stored, the name serves as before."""
    import json
    import shutil

    good = save_adapter(tmp_path / "good", "lora", 11)
    assert upload(deployment, "sturdy", good, promote=True) == 1
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": "abc"}))
    files = {name: (name, (bad / name).read_bytes())
             for name in ("adapter_config.json", "adapter_model.safetensors")}
    refused = httpx.post(f"{deployment.stack.base_url}/v1/adapters",
                         files={"adapter_config": files["adapter_config.json"],
                                "adapter_model": files["adapter_model.safetensors"]},
                         data={"name": "sturdy"},
                         headers={"Authorization": f"Bearer {KEYS['acme']}"}, timeout=120)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "adapter_load_failed" and "serves as before" in error["message"]
    versions = httpx.get(f"{deployment.stack.base_url}/v1/adapters/acme/sturdy/versions",
                         headers={"Authorization": f"Bearer {KEYS['acme']}"}).json()
    assert [v["version"] for v in versions["data"]] == [1]
    reference = Reference(good)
    ids = reference.ids("Hello")
    answer = deployment.client("acme").completions.create(
        model="acme/sturdy", prompt=ids, max_tokens=4, temperature=0)
    assert answer.choices[0].text == reference.text(reference.greedy(ids, 4))


def test_a_version_that_joins_a_split_is_loaded_before_its_first_request(
        deployment: Deployment, tmp_path) -> None:
    """Promote at registration loads a version in the tenant's worker; a version registered
    without it is loaded as soon as a split gives it traffic, before any request names it."""
    first = save_adapter(tmp_path / "first", "lora", 21)
    assert upload(deployment, "ahead", first, promote=True) == 1  # the worker is up now
    second = save_adapter(tmp_path / "second", "lora", 22)
    assert upload(deployment, "ahead", second, promote=False) == 2
    service = deployment.stack.services["manager"]  # its workers log there too

    def loaded() -> bool:
        return "adapter acme/ahead@2 loaded" in "".join(service.log)

    assert not loaded()
    lifecycle(deployment, "acme/ahead", "split",
              weights=[{"version": 1, "weight": 50}, {"version": 2, "weight": 50}])
    deadline = time.monotonic() + 30
    while not loaded():
        assert time.monotonic() < deadline, "the version was not loaded ahead"
        time.sleep(0.1)
    reference = Reference(second)
    expected = reference.text(reference.greedy(reference.ids(PROMPT), 6))
    for user in (f"u{k}" for k in range(40)):  # and it serves as itself
        if choose("acme/ahead", [[1, 50], [2, 50]], user) == 2:
            out = deployment.client("acme").completions.create(
                model="acme/ahead", prompt=PROMPT, max_tokens=6, temperature=0, user=user)
            assert out.choices[0].text == expected
            break
    else:
        raise AssertionError("no user of version 2 among 40")
