"""copy_threads: one torch thread for the copies that waking more would slow, threads as they
are for small copies (torch keeps them on one anyway) and for large ones (two copy faster)."""

from __future__ import annotations

import torch

from wire.call.threads import SPLIT_MIN, SPLIT_PAYS, copy_threads, one_thread


def threads_inside(t: torch.Tensor) -> int:
    with copy_threads(t):
        return torch.get_num_threads()


def test_a_mid_sized_host_copy_runs_on_one_thread_and_the_threads_come_back() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert threads_inside(torch.empty(SPLIT_MIN)) == 1
        assert threads_inside(torch.empty(32, 6144)) == 1  # 0.8 MB: a training call's result
        assert torch.get_num_threads() == 2
        assert threads_inside(torch.empty(SPLIT_MIN - 1)) == 2
        assert threads_inside(torch.empty(SPLIT_PAYS)) == 2
        assert threads_inside(torch.empty(512, 6144)) == 2  # 12.6 MB: two threads pay
        # off the host (a GPU's tensors; the meta device stands in here): threads as they are
        assert threads_inside(torch.empty(32, 6144, device="meta")) == 2
    finally:
        torch.set_num_threads(before)


def test_one_thread_restores_the_threads_after_an_error() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        try:
            with one_thread():
                assert torch.get_num_threads() == 1
                raise ValueError("inside")
        except ValueError:
            pass
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)

