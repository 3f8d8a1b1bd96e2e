"""One real stack (executor, worker manager, gateway processes) shared by the e2e tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from gateway.sessions import new_link
from launcher.ports import free_port
from launcher.stack import Stack
from state.db import db_path
from tests.e2e.adapters import MODEL, Reference, save_adapter

# gamma's end-to-end targets: every first token meets a minute, no gap between tokens meets 1 us;
# its rate limits, which no test comes near, for the dashboard to show
GAMMA_TARGETS = {"ttft_target_ms": 60_000, "inter_token_target_ms": 0.001}
GAMMA_RATES = {"requests_per_minute": 100_000, "tokens_per_minute": 10_000_000}
KEYS = {"acme": "sk-acme-test", "beta": "sk-beta-test", "gamma": "sk-gamma-test"}
OPERATOR_KEY = "sk-operator-test"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}


@dataclass
class Deployment:
    stack: Stack
    adapters: dict[str, Path]  # model id -> adapter directory
    dashboard_link: str = ""  # the token of a one-time dashboard sign-in for gamma

    def client(self, tenant: str, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.stack.base_url}/v1", api_key=KEYS[tenant],
                             max_retries=0, timeout=kw.pop("timeout", 120), **kw)

    def reference(self, model_id: str) -> Reference:
        return Reference(self.adapters.get(model_id))


def register(data_dir: Path, tenant: str, name: str, directory: Path) -> None:
    subprocess.run([sys.executable, "-m", "launcher.cli", "adapters", "register",
                    str(directory), "--tenant", tenant, "--name", name, "--model", MODEL,
                    "--data-dir", str(data_dir)], check=True, capture_output=True)


def deploy(root: Path, **stack_options) -> Deployment:
    data_dir = root / "data"
    data_dir.mkdir(parents=True)
    (data_dir / "tenants.json").write_text(json.dumps({"tenants": [
        {"id": "gamma", "key_sha256": [], "fallback": True, "max_concurrent": 2,
         **GAMMA_TARGETS, **GAMMA_RATES}]}))
    adapters = {}
    for tenant, name, method, seed in (("acme", "lora-a", "lora", 1), ("beta", "ia3-b", "ia3", 2),
                                       ("acme", "prefix-a", "prefix_tuning", 3)):
        directory = save_adapter(root / f"{tenant}-{name}", method, seed)
        register(data_dir, tenant, name, directory)
        adapters[f"{tenant}/{name}"] = directory
    broken = save_adapter(root / "broken", "lora", 4)
    register(data_dir, "gamma", "broken", broken)
    (Path(_record_path(data_dir, "gamma/broken")) / "adapter_model.safetensors").write_bytes(
        b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    keys = ",".join(f"{t}={k}" for t, k in KEYS.items())
    link, link_setting = new_link("gamma")  # as `symbiosis serve` makes one for its dev tenant
    stack = Stack(data_dir, MODEL, port=free_port(), env={"SYMBIOSIS_API_KEYS": keys,
                                       "SYMBIOSIS_ADMIN_KEYS": OPERATOR_KEY,
                                       "SYMBIOSIS_DASHBOARD_LINK": link_setting},
                  **stack_options)
    return Deployment(stack.start(), adapters, link)


def _record_path(data_dir: Path, model_id: str) -> str:
    import sqlite3

    with sqlite3.connect(db_path(data_dir)) as conn:
        return conn.execute("SELECT path FROM models WHERE id = ?", (model_id,)).fetchone()[0]


@pytest.fixture(scope="session")
def deployment(tmp_path_factory) -> Iterator[Deployment]:
    dep = deploy(tmp_path_factory.mktemp("e2e"))
    yield dep
    dep.stack.stop()


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's package), driven by Playwright."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing under CI (apt-get install chromium)")
        pytest.skip("no Chromium here (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield browser
        browser.close()


def sign_in(browser, deployment: Deployment, key: str):
    page = browser.new_page(viewport={"width": 1200, "height": 1400})
    page.goto(f"{deployment.stack.base_url}/dashboard")
    page.fill("#key", key)
    page.click("#sign-in-button")
    return page
