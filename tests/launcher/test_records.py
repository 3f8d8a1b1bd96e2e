"""`symbiosis adapters register` with and without a running manager: the data dir's one writer
makes the change either way (`launcher.records`)."""

from __future__ import annotations

import pytest

from launcher.records import Refused, register
from tests.e2e.adapters import save_adapter
from tests.gateway.manager_stand_in import ManagerStandIn
from workers.manager.records import writing

MODEL = "tiny-llama"


def test_an_adapter_is_registered_through_the_running_manager_or_as_the_writer(tmp_path) -> None:
    data_dir, source = tmp_path / "data", save_adapter(tmp_path / "a", "lora", 1)
    assert register(data_dir, MODEL, "acme", "bot", source) == "acme/bot@1"  # none runs
    manager = ManagerStandIn(data_dir, f"ipc://{tmp_path}/manager.sock")
    try:  # it holds the data dir: the change can only be its
        assert register(data_dir, MODEL, "acme", "bot", source) == "acme/bot@2"
        assert [v.number for v in manager.registry.versions.list("acme/bot")] == [1, 2]
        with pytest.raises(Refused, match="letters, digits"):
            register(data_dir, MODEL, "acme", "no spaces", source)
        with pytest.raises(Refused, match=r"needs adapter_config\.json"):
            register(data_dir, MODEL, "acme", "bot", tmp_path)
    finally:
        manager.close()
    assert list((data_dir / "staging").iterdir()) == []
    assert register(data_dir, MODEL, "acme", "bot", source) == "acme/bot@3"  # it stopped


def test_while_another_tool_changes_the_records_a_registration_is_refused(tmp_path) -> None:
    source = save_adapter(tmp_path / "a", "lora", 1)
    with writing(tmp_path / "data"), pytest.raises(Refused, match="another tool"):
        register(tmp_path / "data", MODEL, "acme", "bot", source)
    assert register(tmp_path / "data", MODEL, "acme", "bot", source) == "acme/bot@1"
