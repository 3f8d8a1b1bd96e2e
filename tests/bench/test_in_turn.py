"""Rows measured in turn: each side's windows alternate (ours, plain, plain, ours), and each
side's figure is the mean of its own windows."""

from bench.group import GroupResult
from bench.scenarios.common import Settings, in_turn


def test_sides_take_their_windows_in_turn_and_each_reports_its_mean() -> None:
    order: list[str] = []

    def side(name: str, rates: list[float]):
        def run(settings: Settings, clients: list[dict]) -> GroupResult:
            assert clients == [{"kind": "train"}]
            order.append(name)
            elapsed = 1.0 / rates[len([n for n in order if n == name]) - 1]
            return GroupResult([{"kind": "train", "latencies": [elapsed],
                                 "tokens_per_unit": 1, "elapsed": elapsed}], 0, 0.0)
        return run

    settings = Settings(quick=True)
    ours, plain = in_turn(settings, [{"kind": "train"}],
                          (side("ours", [10.0, 30.0]), side("plain", [4.0, 8.0])))
    assert order == ["ours", "plain", "plain", "ours"] and settings.rounds == 2
    assert (ours, plain) == (20.0, 6.0)
    order.clear()
    in_turn(Settings(toy=True), [{"kind": "train"}],
            (side("ours", [1.0]), side("plain", [1.0])))
    assert order == ["ours", "plain"]
