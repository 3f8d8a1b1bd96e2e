"""The stop signal of the executor, the manager and the launcher, in child processes of their own
(signal handlers and the wakeup fd belong to a process's main thread)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

# The child: a thread that sleeps, SIGTERM delivered to that thread (not the main one), and the
# main thread waiting the way the executor does (`stop`), the way it did (`event`) or the way the
# launcher does (`timed`: a StopSignal with a timeout, in a loop).
CHILD = """
import signal, sys, threading, time
from wire.stopping import StopSignal

sleeper = threading.Thread(target=time.sleep, args=(30,), daemon=True)
sleeper.start()
if sys.argv[1] == "event":
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
else:
    stop = StopSignal()
how, delay = sys.argv[2], float(sys.argv[3])
if how == "thread-signal":
    threading.Timer(delay, signal.pthread_kill, (sleeper.ident, signal.SIGTERM)).start()
elif how == "set":
    threading.Timer(delay, stop.set).start()
print("waiting", flush=True)
if sys.argv[1] == "timed":  # as the launcher waits: a look around every 0.2 s
    rounds = 1
    while not stop.wait(0.2):
        rounds += 1
    print("rounds", rounds, flush=True)
else:
    stop.wait()
print("stopped", getattr(stop, "signal", None), flush=True)
"""


def child(waiter: str, how: str, delay: float = 0.3) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, waiter, how, str(delay)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "waiting\n"
    return proc


def test_a_signal_that_reaches_another_thread_stops_the_wait() -> None:
    proc = child("stop", "thread-signal")
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert out == f"stopped {int(signal.SIGTERM)}\n"


def test_an_event_wait_sleeps_through_that_signal() -> None:
    """Why: the executor's main thread used to wait on an Event, which this signal never
    wakes (CPython runs handlers on the main thread only, when it wakes)."""
    proc = child("event", "thread-signal")
    time.sleep(3)
    try:
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.communicate()


def test_set_from_another_thread_stops_the_wait() -> None:
    proc = child("stop", "set")
    out, _ = proc.communicate(timeout=20)
    assert (proc.returncode, out) == (0, "stopped None\n")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_process_stops_the_wait(sig: int) -> None:
    proc = child("stop", "signal")
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=20)
    assert (proc.returncode, out) == (0, f"stopped {int(sig)}\n")


def test_sigusr1_writes_every_threads_stack_and_the_wait_goes_on() -> None:
    proc = child("stop", "signal")
    proc.send_signal(signal.SIGUSR1)
    time.sleep(1)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert out == f"stopped {int(signal.SIGTERM)}\n"
    assert "Current thread" in err  # the main thread (about to wait, or waiting)
    assert err.lower().count("thread 0x") >= 2  # the sleeper too


def test_a_timed_wait_returns_at_its_timeout_and_stops_at_a_signal_to_another_thread() -> None:
    proc = child("timed", "thread-signal", 1.5)  # after several rounds of 0.2 s
    out, _ = proc.communicate(timeout=20)
    lines = out.splitlines()
    assert proc.returncode == 0
    assert lines[1] == f"stopped {int(signal.SIGTERM)}"
    assert int(lines[0].split()[1]) >= 2  # a timed wait ended at 0.2 s, unstopped, first


def test_a_timed_wait_without_a_stop_returns_false_after_the_timeout() -> None:
    code = ("import time; from wire.stopping import StopSignal; s = StopSignal(); "
            "t = time.monotonic(); r = s.wait(0.3); print(r, round(time.monotonic() - t, 1)); "
            "s.set(); print(s.wait(5), s.wait(0))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=20, check=True).stdout
    first, second = out.splitlines()
    assert first.split()[0] == "False" and 0.3 <= float(first.split()[1]) < 3.0
    assert second == "True True"
