"""The executor's weights in memory of their own, advised for 2 MiB pages (executor.pages)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM

from catalogue.resolve import resolve_model
from executor import pages
from executor.registry import LayerRegistry, _own_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")


def mappings(pid: int | str = "self") -> Iterator[tuple[tuple[int, int], set[str]]]:
    """(start, end) and VmFlags of each of the process's mappings, from its smaps."""
    span = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            span = tuple(int(part, 16) for part in head.split("-"))
        elif line.startswith("VmFlags:"):
            yield span, set(line.split()[1:])


def mapping_of(address: int) -> tuple[tuple[int, int], set[str]] | None:
    """(start, end) and VmFlags of this process's mapping that holds `address`."""
    return next(((span, flags) for span, flags in mappings()
                 if span[0] <= address < span[1]), None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_large_copy_is_equal_aligned_and_advised_for_huge_pages(dtype):
    source = torch.randn(3000, 700).to(dtype)  # 8.4 / 4.2 MB: more than one 2 MiB page
    copy = pages.own_copy(source)
    assert torch.equal(copy, source) and copy.dtype == dtype and copy.is_contiguous()
    assert copy.data_ptr() != source.data_ptr()
    assert copy.data_ptr() % pages.HUGE_PAGE == 0
    nbytes = source.numel() * source.element_size()
    (start, end), flags = mapping_of(copy.data_ptr())
    assert "hg" in flags  # MADV_HUGEPAGE
    assert "sh" not in flags  # private: a shared anonymous mapping would be shmem
    assert end - start == nbytes // pages.HUGE_PAGE * pages.HUGE_PAGE  # whole huge pages
    _, tail = mapping_of(copy.data_ptr() + nbytes - 1)
    assert "nh" in tail  # the rest on small pages, even where the kernel's default is always
    source.zero_()
    assert copy.abs().sum() > 0  # its own memory


def test_small_tensors_and_the_switch_off_get_plain_copies():
    for source, huge in ((torch.randn(64, 64), True), (torch.randn(3000, 700), False)):
        copy = pages.own_copy(source, huge)
        assert torch.equal(copy, source) and copy.data_ptr() != source.data_ptr()
        _, flags = mapping_of(copy.data_ptr())
        assert "hg" not in flags


def test_a_copys_mapping_goes_with_the_tensor():
    copy = pages.own_copy(torch.randn(3000, 700))
    address = copy.data_ptr()
    assert mapping_of(address) is not None
    del copy
    gc.collect()
    after = mapping_of(address)  # gone, or a later allocation of ours (never advised) took it
    assert after is None or "hg" not in after[1]


def test_advice_the_kernel_refuses_leaves_a_working_mapping():
    import mmap

    mapping = mmap.mmap(-1, 2 * pages.HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # a start off a page boundary gets EINVAL, the answer of a kernel built without THP
    assert not pages.advise(mapping, 1, pages.HUGE_PAGE)
    mapping[:4] = b"abcd"
    assert mapping[:4] == b"abcd"
    assert pages.advise(mapping, 0, pages.HUGE_PAGE)


def test_a_tensor_off_the_host_is_cloned_where_it_is():
    source = torch.empty(3000, 700, device="meta")  # stands for a GPU's: no host pages
    copy = pages.own_copy(source.t())
    assert copy.device.type == "meta" and copy.is_contiguous() and copy.shape == (700, 3000)


def test_a_transposed_source_is_copied_contiguous():
    source = torch.randn(700, 3000).t()
    copy = pages.own_copy(source)
    assert copy.is_contiguous() and torch.equal(copy, source)


@pytest.mark.parametrize("huge", [True, False])
def test_the_registrys_head_is_advised_and_computes_what_the_plain_model_does(huge):
    path = resolve_model("tiny-llama")
    registry = LayerRegistry.load(path, huge_pages=huge)
    plain = AutoModelForCausalLM.from_pretrained(path).eval()
    head = registry.by_name["lm_head"]  # 12.8 MB, copied whole out of the checkpoint's map
    _, flags = mapping_of(head.weight.data_ptr())
    assert ("hg" in flags) == huge
    x = torch.randn(3, head.spec.in_features)
    assert torch.equal(F.linear(x, head.weight), F.linear(x, plain.lm_head.weight))


class TwoProjections(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(700, 1500, bias=False)  # 4.2 MB each: a group over 2 MiB pages
        self.up = nn.Linear(700, 1500, bias=False)


@pytest.mark.parametrize("huge", [True, False])
def test_a_fused_group_is_concatenated_into_advised_memory(huge):
    model = TwoProjections()
    registry = LayerRegistry.from_model(model, [["gate", "up"]], model_name="two",
                                        huge_pages=huge)
    group = registry.by_name["gate+up"]
    assert torch.equal(group.weight, torch.cat([model.gate.weight, model.up.weight]))
    _, flags = mapping_of(group.weight.data_ptr())
    assert ("hg" in flags) == huge
    gate = registry.by_name["gate"]  # a member: a view into the group's weight
    assert gate.weight.data_ptr() == group.weight.data_ptr()
    assert torch.equal(gate.weight, model.gate.weight)


class LookedUpAndTied(TwoProjections):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1500, 700)  # 4.2 MB: looked up a row a token
        self.tied = nn.Embedding(1500, 700)
        self.head = nn.Linear(700, 1500, bias=False)
        self.head.weight = self.tied.weight  # a product's weight too


def test_only_products_not_copied_again_go_onto_huge_pages_at_load():
    """`_own_memory` advises a product's weight (`up`, and `head` with the embedding tied to it);
    a fused group's member (`gate`, which `_fuse` copies again) and an embedding looked up by
    rows stay on small pages: each fresh 2 MiB page can cost milliseconds to fault in."""
    model = LookedUpAndTied()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    _own_memory(model, True, {"gate"})
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]), name
        advised = "hg" in mapping_of(param.data_ptr())[1]
        assert advised == (name in ("up.weight", "tied.weight")), name
    assert model.head.weight is model.tied.weight
    _own_memory(model, False, set())
    assert not any("hg" in mapping_of(p.data_ptr())[1] for p in model.parameters())


def test_a_group_off_the_host_is_concatenated_where_it_is():
    model = TwoProjections().to("meta")  # stands for a GPU's: no host pages
    registry = LayerRegistry.from_model(model, [["gate", "up"]], model_name="two",
                                        huge_pages=True)
    group = registry.by_name["gate+up"]
    assert group.weight.device.type == "meta" and group.weight.shape == (3000, 700)


def advised_bytes(pid: int) -> int:
    """Bytes of the process's mappings advised MADV_HUGEPAGE."""
    return sum(end - start for (start, end), flags in mappings(pid) if "hg" in flags)


def test_the_executor_process_keeps_its_weights_as_its_flag_says(executor_for):
    advised = advised_bytes(executor_for("tiny-llama").proc.pid)
    assert advised >= 12 << 20  # the 12.8 MB head, in whole 2 MiB pages
    small = executor_for("tiny-llama", no_huge_pages="")
    assert advised_bytes(small.proc.pid) == 0
