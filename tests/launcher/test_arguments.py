"""`symbiosis serve`'s flags refuse what the services would refuse, and only that: for each flag
with a rule, sample values are given to the flag's type and, as its variable, to the settings of
the executor, the worker manager and the gateway; both accept or both refuse each one."""

from __future__ import annotations

import argparse
import math

import pytest
from pydantic import ValidationError

from executor.config import ExecutorConfig
from gateway.settings import GatewaySettings
from launcher import serve_flags
from launcher.arguments import bounded
from workers.manager.config import ManagerConfig

SAMPLES = ["-1", "0", "0.5", "1", "1.0", "2", "65535", "65536", "1e3", "inf", "x", "", "true",
           "YES", "off", "cpu", "cuda", "cuda:1", "cuda:123", "cudax", "gpu", "float16", "fp16",
           "eager", "greedy"]
LAUNCHER_OWN = {"--mps", "--idle-training"}  # read by the launcher itself (mps.py, stack.py)
RULED = [s for s in serve_flags.SETTINGS if s.type is not str and s.flag not in LAUNCHER_OWN]


def _flag_takes(setting: serve_flags.Setting, text: str) -> bool:
    try:
        setting.type(text)
    except argparse.ArgumentTypeError:
        return False
    return True


def _services_take(variable: str, text: str, monkeypatch) -> bool:
    monkeypatch.setenv(variable, text)
    try:
        ExecutorConfig()
        ManagerConfig()
        GatewaySettings()
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("setting", RULED, ids=lambda s: s.flag)
def test_a_flag_refuses_exactly_what_its_service_refuses(setting, monkeypatch) -> None:
    for variable in ("SYMBIOSIS_EXECUTOR_BIND", "SYMBIOSIS_MANAGER"):
        monkeypatch.delenv(variable, raising=False)
    verdicts = {text: _flag_takes(setting, text) for text in SAMPLES}
    services = {text: _services_take(setting.variable, text, monkeypatch) for text in SAMPLES}
    assert verdicts == services
    assert True in verdicts.values() and False in verdicts.values()  # a rule, on both sides


def test_every_setting_but_names_and_places_has_a_rule() -> None:
    free = {s.flag for s in serve_flags.SETTINGS if s.type is str}
    assert free == {"--model", "--data-dir", "--model-cache", "--host"}


@pytest.mark.parametrize(("parse", "text", "says"), [
    (bounded(int, 1), "-3", "an integer at least 1, not -3"),
    (bounded(int, 1), "two", "an integer at least 1, not 'two'"),
    (bounded(float, 0, above=True), "0", "a number above 0, not 0"),
    (bounded(float, 0), "nan", "a number at least 0, not nan"),
    (bounded(float, 0, 1, above=True), "1", "a number between 0 and 1, both excluded, not 1"),
    (bounded(int, 0, 65535, what="a port"), "70000", "a port is 0..65535, not 70000"),
])
def test_a_bound_says_its_rule_and_the_value(parse, text, says) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse(text)
    assert str(refused.value) == says


def test_a_bound_keeps_its_edges() -> None:
    assert bounded(int, 0, 65535)("0") == 0 and bounded(int, 0, 65535)("65535") == 65535
    assert bounded(float, 0, above=True)("1e-9") == 1e-9
    assert math.isinf(bounded(float, 0)("inf"))
