"""Adapter versions in SQLite: immutable versions, the serving split, promote, rollback, delete,
the sticky choice of a version, and the migration of a database from before versions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from state.db import Database
from state.migrations import MIGRATIONS
from state.versions import choose, split_id, weights
from tests.e2e.adapters import MODEL, save_adapter
from workers.manager.adapter_store import AdapterError, AdapterRegistry
from workers.manager.version_store import VersionError


@pytest.fixture
def registry(tmp_path) -> AdapterRegistry:
    return AdapterRegistry(Database(tmp_path / "state.db"), tmp_path, MODEL)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("adapters")
    return [save_adapter(root / f"a{seed}", "lora", seed) for seed in (1, 2, 3)]


def serving(registry: AdapterRegistry, model_id: str = "acme/bot") -> list[list[int]]:
    return weights(registry.get(model_id).serving)


def test_each_registration_is_a_new_immutable_version(registry, sources) -> None:
    first = registry.register("acme", "bot", sources[0])
    second = registry.register("acme", "bot", sources[1])
    assert (first.id, second.id) == ("acme/bot@1", "acme/bot@2")
    assert first.path != second.path
    assert Path(first.path, "adapter_model.safetensors").read_bytes() == \
        Path(sources[0], "adapter_model.safetensors").read_bytes()
    record = registry.get("acme/bot")
    assert serving(registry) == [[2, 100]] and record.version == 2 and record.path == second.path
    lineage = json.loads(second.lineage)
    assert lineage["peft_config"]["peft_type"] == "LORA" and len(lineage["adapter_sha256"]) == 64
    quiet = registry.register("acme", "bot", sources[2], in_service=False)
    assert quiet.number == 3 and serving(registry) == [[2, 100]]
    assert [v.number for v in registry.versions.list("acme/bot")] == [1, 2, 3]


@pytest.mark.parametrize("name", ["bot\n", "../bot", ".bot", "b" * 65, ""])
def test_a_name_outside_the_rule_is_refused_by_the_store_too(registry, sources,
                                                             name: str) -> None:
    with pytest.raises(AdapterError, match="adapter names use"):
        registry.register("acme", name, sources[0])
    assert registry.get(f"acme/{name}") is None


def test_promote_and_rollback_walk_the_history(registry, sources) -> None:
    for source in sources:
        registry.register("acme", "bot", source, in_service=False)
    registry.promote("acme/bot", 1)
    registry.promote("acme/bot", 3)
    registry.versions.split("acme/bot", [[3, 90], [2, 10]])
    assert serving(registry) == [[2, 10], [3, 90]] and registry.get("acme/bot").version == 3
    assert registry.versions.rollback("acme/bot") == [[3, 100]]
    assert registry.versions.rollback("acme/bot") == [[1, 100]]
    assert registry.get("acme/bot").path == registry.versions.get("acme/bot", 1).path
    with pytest.raises(VersionError, match="nothing to roll back to: no earlier"):
        registry.versions.rollback("acme/bot")  # they did change: the changes are undone
    registry.promote("acme/bot")  # the latest
    assert serving(registry) == [[3, 100]]


def test_a_split_names_known_versions_with_positive_weights(registry, sources) -> None:
    registry.register("acme", "bot", sources[0])
    with pytest.raises(VersionError) as missing:
        registry.versions.split("acme/bot", [[1, 50], [7, 50]])
    assert missing.value.status == 404
    for bad in ([[1, 50], [1, 50]], [[1, 0]]):
        with pytest.raises(VersionError) as invalid:
            registry.versions.split("acme/bot", bad)
        assert invalid.value.status == 400
    assert serving(registry) == [[1, 100]]


def test_deleting_a_version_that_serves_is_refused(registry, sources) -> None:
    for source in sources:
        registry.register("acme", "bot", source)
    with pytest.raises(VersionError, match="in service"):
        registry.versions.delete("acme/bot", 3)
    gone = registry.versions.delete("acme/bot", 2)  # in the history: rollback skips it
    assert not Path(gone.path).exists()
    assert registry.versions.rollback("acme/bot") == [[1, 100]]
    with pytest.raises(VersionError) as missing:
        registry.versions.delete("acme/bot", 2)
    assert missing.value.status == 404
    assert [v.id for v in registry.versions.list("acme/bot")] == ["acme/bot@1", "acme/bot@3"]
    assert registry.delete("acme/bot") == ["acme/bot@1", "acme/bot@3"]
    assert registry.get("acme/bot") is None and registry.versions.list("acme/bot") == []


def test_a_job_result_id_has_exactly_one_version(registry, sources) -> None:
    registry.register("acme", "", sources[0], model_id="ft:m:acme::job1", origin="fine-tune",
                      in_service=False)
    assert serving(registry, "ft:m:acme::job1") == [] and not registry.get("ft:m:acme::job1") \
        .in_service
    with pytest.raises(AdapterError, match="already exists"):
        registry.register("acme", "", sources[1], model_id="ft:m:acme::job1", origin="fine-tune")


def test_the_choice_of_a_version_is_sticky_per_user_and_follows_the_weights() -> None:
    split = [[1, 90], [2, 10]]
    users = [f"user-{i}" for i in range(2000)]
    first = {u: choose("acme/bot", split, u) for u in users}
    assert all(choose("acme/bot", split, u) == first[u] for u in users)
    share = sum(v == 2 for v in first.values()) / len(users)
    assert abs(share - 0.1) < 4 * math.sqrt(0.1 * 0.9 / len(users))
    draws = [choose("acme/bot", split, None) for _ in range(4000)]
    assert abs(draws.count(2) / 4000 - 0.1) < 4 * math.sqrt(0.1 * 0.9 / 4000)
    assert choose("acme/bot", [[5, 1]], "anyone") == 5


def test_version_ids() -> None:
    assert split_id("acme/bot@12") == ("acme/bot", 12)
    assert split_id("ft:tiny:acme::ftjob-x@1") == ("ft:tiny:acme::ftjob-x", 1)
    assert split_id("acme/bot") == ("acme/bot", None)
    assert split_id("acme/bot@") == ("acme/bot@", None)
    assert split_id("acme/bot@x1") == ("acme/bot@x1", None)
    assert split_id("acme/bot@1\n") == ("acme/bot@1\n", None)  # no version: the whole id
    assert split_id("acme/bot@01") == ("acme/bot@01", None)  # one way to write each version
    assert split_id("acme/bot@0") == ("acme/bot@0", None)


def test_a_database_from_before_versions_migrates(tmp_path, sources) -> None:
    old = Database(tmp_path / "state.db", MIGRATIONS[:4])
    with old.transaction() as conn:
        for model_id, in_service in (("acme/old", 1), ("ft:m:acme::j", 0)):
            conn.execute("INSERT INTO models (id, tenant, base, path, peft_type, created, "
                         "source, in_service) VALUES (?, 'acme', ?, ?, 'LORA', 5, 'registered', "
                         "?)", (model_id, MODEL, str(sources[0]), in_service))
    old.close()
    registry = AdapterRegistry(Database(tmp_path / "state.db"), tmp_path, MODEL)
    assert serving(registry, "acme/old") == [[1, 100]]
    assert serving(registry, "ft:m:acme::j") == []
    version = registry.versions.get("acme/old", 1)
    assert version.path == str(sources[0]) and version.passed_gates == 1
    assert registry.versions.get("ft:m:acme::j", 1).passed_gates == 0
    assert registry.register("acme", "old", sources[1]).number == 2
