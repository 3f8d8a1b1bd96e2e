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
