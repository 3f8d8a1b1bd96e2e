"""The executor's matmul: x W^T + b by the fastest route for the shape and the device."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from wire.call.threads import one_thread

ONEDNN_MAX_ROWS = 512
ONEDNN_MIN_WEIGHT = 1 << 19  # in * out: 2 MB of fp32, more than a core's L2
ONEDNN_MIN_WIDTH = 256  # on one thread, MKL wins for narrow inputs (64 x 50k: 650 vs 733 us)
SINGLE_THREAD_MACS = 1 << 21  # rows * in * out
INTO_MIN_ROWS = 128  # `linear_into`: MKL in place from here, where `linear` takes oneDNN
_onednn_linear = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """x W^T + b, by the fastest CPU route measured on a 2-core AMD EPYC (fp32, median us):

    - up to a few hundred rows through a large weight go through oneDNN: MKL is 1.1-3x slower
      there (8 rows through a 50k-vocab lm_head: 15 ms vs 40 ms; 768x4096: 1.9 vs 2.5 ms; 256
      rows, 768 x 50k: 144 vs 191 ms, 768 x 6144: 16 vs 20 ms). Only for a contiguous weight:
      through a transposed view (the backward's) oneDNN is slower (256 rows: 199 vs 139 ms);
    - so do weights from 2 MB (fp32) up, which a model's pass reads from memory, not cache:
      cycling through 200 MB of such weights on 2 threads, oneDNN against MKL was 136 vs 188 us
      (768x768, 1 row), 587 vs 931 (2304x768, 8 rows), 225 vs 290 (768x768, 8 rows); a
      llama-160m stretch of 8 rows went from 3.9 to 2.8 ms. Only a weight that stays in cache
      (a tiny model, a microbenchmark) runs ~12 us faster with MKL, so smaller ones stay there;
    - tiny products run on one thread: waking a second one costs ~150 us (64x64, 8 rows: 12 vs
      154).
    All routes read the same dense weight, no copy. oneDNN's op has no autograd formula: a
    product that autograd must differentiate (a stretch's backward recomputes its forward)
    takes F.linear.
    """
    if x.device.type != "cpu" or x.dim() != 2:
        return F.linear(x, weight, bias)
    if _tiny(x, weight):
        with one_thread():
            return F.linear(x, weight, bias)
    if _takes_onednn(x, weight):
        try:
            return _onednn_linear(x, weight, bias, "none", [], "")
        except RuntimeError:
            pass
    return F.linear(x, weight, bias)


def linear_into(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                out: torch.Tensor) -> None:
    """`linear(x, weight, bias)` written into `out` (contiguous [rows, out_features], the
    client's result memory): MKL's product, which `linear` itself takes where oneDNN does not
    (a transposed weight: a backward's, a GPT-2 Conv1D's forward), writes there without the copy
    a fresh result needs.
    Where `linear` takes oneDNN, MKL writing in place wins from `INTO_MIN_ROWS` rows (2-core
    Xeon, fp32, in place against oneDNN and a copy: 0.78-1.01x at 128 rows and 0.79-0.99x at 512
    over eight shapes from 768 x 768 to 768 x 50k and 2048 x 5632; at 8-64 rows 0.57-1.73x, a
    large weight's worse; bench NOTES), so fewer rows keep oneDNN and the copy."""
    if x.device.type != "cpu" or x.dim() != 2 or (x.requires_grad and torch.is_grad_enabled()) \
            or (x.shape[0] < INTO_MIN_ROWS and _takes_onednn(x, weight)):
        out.copy_(linear(x, weight, bias))
        return
    with one_thread() if _tiny(x, weight) else contextlib.nullcontext():
        if bias is None:
            torch.mm(x, weight.t(), out=out)
        else:
            torch.addmm(bias, x, weight.t(), out=out)


def _tiny(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.shape[0] * weight.shape[0] * weight.shape[1] < SINGLE_THREAD_MACS


def _takes_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    rows, (out_features, in_features) = x.shape[0], weight.shape
    return (_onednn_linear is not None and rows <= ONEDNN_MAX_ROWS
            and in_features * out_features >= ONEDNN_MIN_WEIGHT and weight.is_contiguous()
            and (in_features >= ONEDNN_MIN_WIDTH or torch.get_num_threads() > 1)
            and x.dtype in (torch.float32, torch.bfloat16)
            and not (x.requires_grad and torch.is_grad_enabled()))


class Linear:
    """A linear layer's op as the engine runs it: `self(x)` returns x W^T + b, `into(x, out)`
    writes it into the caller's memory (a lone call's result region)."""

    __slots__ = ("bias", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def into(self, x: torch.Tensor, out: torch.Tensor) -> None:
        linear_into(x, self.weight, self.bias, out)
