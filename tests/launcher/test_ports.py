"""launcher.ports: ports free now that no outgoing connection or port-0 bind can take later."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from launcher import ports

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not RANGE.exists(), reason="no Linux ephemeral port range to read")
def test_the_ephemeral_range_is_read_from_the_kernel() -> None:
    assert ports.ephemeral_low() == int(RANGE.read_text().split()[0])


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound() -> None:
    for port in ports.free_ports(20):
        assert ports.LOWEST <= port < ports.ephemeral_low()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()


def test_free_ports_are_distinct() -> None:
    chosen = ports.free_ports(50)
    assert len(set(chosen)) == 50


def test_a_port_in_use_is_never_chosen(tmp_path, monkeypatch) -> None:
    """With the one candidate below the range held by a listener, the pick falls back to the
    kernel's, which is free."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        (tmp_path / "range").write_text(f"{taken + 1}\t60999\n")
        monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "range")
        monkeypatch.setattr(ports, "LOWEST", taken)
        port = ports.free_port()
        assert port != taken
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_an_unreadable_range_falls_back_to_ianas(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "missing")
    assert ports.ephemeral_low() == 49_152
