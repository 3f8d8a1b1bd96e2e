from workers.manager.config import ManagerConfig, parse_config


def test_flags_override_environment(monkeypatch):
    monkeypatch.setenv("SYMBIOSIS_MAX_WORKERS", "3")
    monkeypatch.setenv("SYMBIOSIS_PRIVACY", "true")
    config = parse_config(["--executor", "tcp://e:1", "--pin", "t1|m", "--pin", "t2|m",
                           "--max-jobs", "2"])
    assert config == ManagerConfig(executor="tcp://e:1", max_workers=3, privacy=True,
                                   pinned=frozenset({"t1|m", "t2|m"}), max_jobs=2)


def test_environment_alone_configures_a_container(monkeypatch):
    monkeypatch.setenv("SYMBIOSIS_EXECUTOR", "tcp://executor:5555")
    monkeypatch.setenv("SYMBIOSIS_DATA_DIR", "/data")
    monkeypatch.setenv("SYMBIOSIS_WORKER_IDLE_S", "30")
    config = parse_config([])
    assert (config.executor, config.data_dir, config.idle_s, config.privacy) == \
        ("tcp://executor:5555", "/data", 30.0, False)


def test_worker_device_and_kv_budget_from_environment_or_flags(monkeypatch):
    import pydantic
    import pytest

    monkeypatch.setenv("SYMBIOSIS_WORKER_DEVICE", "cuda:1")
    monkeypatch.setenv("SYMBIOSIS_KV_BUDGET_MB", "512")
    config = parse_config([])
    assert (config.worker_device, config.kv_budget_mb) == ("cuda:1", 512.0)
    assert parse_config(["--worker-device", "cpu"]).worker_device == "cpu"
    for bad in ("gpu", "cuda:x", "cpu;rm"):
        with pytest.raises(pydantic.ValidationError, match="worker_device"):
            parse_config(["--worker-device", bad])
