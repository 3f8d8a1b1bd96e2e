"""Remote stand-ins for a model's frozen weight-bearing layers (module swap, gpt-fast style).

Each subclasses the layer it replaces (nn.Linear, transformers Conv1D, nn.Embedding) so that peft
wraps it as usual, and carries a data-less stub weight with the real shape and dtype: enough for
peft to size its adapters, while any attempt to compute with it (DoRA, merging) fails clearly.
Forward and backward run in the executor; nothing is saved between them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from wire.call.messages import CallKind, LayerSpec, Op
from wire.call.threads import copy_threads
from workers.remote.handle import ExecutorHandle
from workers.remote.parts import Parts


class BaseWeightUnavailable(RuntimeError):
    pass


_METADATA = {
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.requires_grad_,
    torch.Tensor.is_floating_point, torch.Tensor.is_complex, torch.Tensor.element_size,
    torch.Tensor.detach, torch.Tensor.__repr__, torch.Tensor.data_ptr, torch.Tensor.__hash__,
    torch.Tensor.__format__, torch.Tensor.storage_offset, torch.Tensor.stride,
    torch.Tensor.is_contiguous, torch.Tensor.nelement, torch.Tensor.__reduce_ex__,
    torch.Tensor.untyped_storage, torch.Tensor.is_shared, torch.Tensor.is_pinned,
    torch.Tensor.get_device,
}


class StubWeight(torch.Tensor):
    """Shape, dtype and device of a base weight, and no data (one element, zero strides)."""

    @staticmethod
    def __new__(cls, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str):
        data = torch.zeros((), dtype=dtype, device=device).expand(*shape)
        return torch.Tensor._make_subclass(cls, data, False)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None):
        if func in _METADATA or getattr(func, "__name__", "") in ("__get__", "__set__"):
            return super().__torch_function__(func, types, args, kwargs or {})
        raise BaseWeightUnavailable(
            f"{getattr(func, '__name__', func)} on a base weight: the base weights live in the "
            "shared executor (split execution), so methods that read them, such as DoRA, or "
            "that change them, such as merging an adapter (merge_and_unload), are not supported"
        )


def stub_parameter(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str):
    return nn.Parameter(StubWeight(shape, dtype, device), requires_grad=False)


MAX_CALL_BYTES = 16 * 2**20


def chunked_calls(executor: ExecutorHandle, op: Op, index: int, x: torch.Tensor,
                  kind: CallKind, width: int):
    """(start, stop, result rows) of one call per chunk of rows of x [rows, in] (ids: [rows]).

    Large calls (an lm_head over a long sequence is 200 KB per row) are split so that shared
    memory stays small and one call never holds the executor for long.
    """
    row_bytes = 4 * max(width, x.shape[1] if x.dim() == 2 else 1)
    step = max(1, MAX_CALL_BYTES // row_bytes)
    for start in range(0, x.shape[0], step):
        stop = min(start + step, x.shape[0])
        yield start, stop, executor.call(op, index, x[start:stop], kind)


def current_kind() -> CallKind:
    return CallKind.TRAINING if torch.is_grad_enabled() else CallKind.INFERENCE


class Stage:
    """A result computed ahead for a remote layer (by a stretch), handed out when the layer is
    called with the very input it was computed for; and whether the layer passes its input
    through while a stretch captures it. A plain object: cheap to set on every call."""

    __slots__ = ("input", "output", "passthrough", "version")

    def __init__(self) -> None:
        self.input: torch.Tensor | None = None
        self.version = -1
        self.output: torch.Tensor | None = None
        self.passthrough = False

    def put(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.input, self.version, self.output = x, x._version, y

    def take(self, x: torch.Tensor) -> torch.Tensor | None:
        """The staged output if `x` is its input (or a view of all of it, as a model's
        `hidden[:, -1:]` of one position is), unchanged since; the stage empties."""
        staged, y = self.input, self.output
        self.input = self.output = None
        if staged is None or not (staged is x or _all_of(x, staged)):
            return None
        return y if self.version == x._version else None


def _all_of(view: torch.Tensor, base: torch.Tensor) -> bool:
    """`view` is a view of all of `base` (itself maybe a view: of a stretch's result), element
    for element."""
    root = base if base._base is None else base._base
    return (view._base is root and view.shape == base.shape and view.stride() == base.stride()
            and view.storage_offset() == base.storage_offset())


class RemoteLayer:
    """Mixin: the layer id, the executor handle, stub parameters that follow `.to()`."""

    spec: LayerSpec
    executor: ExecutorHandle
    weight: nn.Parameter
    bias: nn.Parameter | None
    stage: Stage

    def _setup(self, spec: LayerSpec, executor: ExecutorHandle, weight_shape: tuple[int, ...],
               bias_shape: tuple[int, ...] | None, dtype: torch.dtype, device: torch.device):
        self.spec = spec
        self.executor = executor
        self.stage = Stage()
        self._shapes = {"weight": weight_shape, "bias": bias_shape}
        self._stubs(dtype, device)

    def _stubs(self, dtype: torch.dtype, device: torch.device) -> None:
        for name, shape in self._shapes.items():
            self._parameters[name] = None if shape is None else stub_parameter(shape, dtype, device)

    def _apply(self, fn, recurse: bool = True):  # .to(), .half(), .cuda(): retype the stubs only
        probe = fn(torch.zeros((), dtype=self.weight.dtype, device=self.weight.device))
        self._stubs(probe.dtype, probe.device)
        return self

    def remote(self, op: Op, x: torch.Tensor, index: int, width: int, kind: CallKind,
               dtype: torch.dtype) -> torch.Tensor:
        """Executor calls (chunked by rows); the result is a fresh tensor [..., width]."""
        return remote_rows(self.executor, op, index, x, kind, width, dtype)


def remote_rows(executor: ExecutorHandle, op: Op, index: int, x: torch.Tensor | Parts,
                kind: CallKind, width: int, dtype: torch.dtype,
                fresh: bool = True) -> torch.Tensor:
    """x [..., in] (ids: [...]; `Parts` [rows, in]) through a base layer: a fresh tensor
    [..., width] of `dtype`. One call when it fits (the executor's result is copied out once),
    else row chunks. `fresh=False`: the result may be a view of the call's memory, valid until
    the executor's next call (for a caller that copies it out anyway, in parts)."""
    row_bytes = 4 * max(width, x.shape[-1] if x.is_floating_point() else 1)
    if isinstance(x, Parts) and (x.shape[0] * row_bytes > MAX_CALL_BYTES or
                                 not getattr(executor, "takes_parts", False)):
        x = x.joined()
    lead = x.shape[:-1] if x.is_floating_point() else x.shape
    if isinstance(x, Parts):
        flat = x
    else:
        flat = x.reshape(-1, x.shape[-1]) if x.is_floating_point() else x.reshape(-1)
    if flat.shape[0] * row_bytes <= MAX_CALL_BYTES:
        y = executor.call(op, index, flat, kind).view(*lead, width)
        same = y.dtype == dtype and y.device == x.device
        if same and not fresh:
            return y
        with copy_threads(y):  # a clone: 1 us less than .to
            return y.clone() if same else y.to(device=x.device, dtype=dtype, copy=True)
    out = torch.empty(*lead, width, dtype=dtype, device=x.device)
    flat_out = out.view(-1, width)
    for start, stop, y in chunked_calls(executor, op, index, flat, kind, width):
        flat_out[start:stop].copy_(y)
    return out


class _RemoteLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, layer: RemoteLinear, kind: CallKind) -> torch.Tensor:
        ctx.layer = layer
        ctx.x_dtype = x.dtype
        spec = layer.spec
        return layer.remote(Op.FORWARD, x, spec.index, spec.out_features, kind, x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        spec = ctx.layer.spec
        grad_x = ctx.layer.remote(Op.BACKWARD, grad, spec.index, spec.in_features,
                                  CallKind.TRAINING, ctx.x_dtype)
        return grad_x, None, None


def remote_linear(layer: RemoteLayer, x: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled():  # inference: no autograd node to build
        spec = layer.spec
        return layer.remote(Op.FORWARD, x, spec.index, spec.out_features, CallKind.INFERENCE,
                            x.dtype)
    return _RemoteLinearFn.apply(x, layer, CallKind.TRAINING)


class RemoteLinear(RemoteLayer, nn.Linear):
    def __init__(self, spec: LayerSpec, executor: ExecutorHandle, dtype: torch.dtype,
                 device: torch.device) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = spec.in_features, spec.out_features
        self.fusion = None  # a FusedGroup when this layer shares its input with siblings
        self._setup(spec, executor, (spec.out_features, spec.in_features),
                    (spec.out_features,) if spec.has_bias else None, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stage = self.stage
        if stage.passthrough:
            return x
        if stage.input is not None and (y := stage.take(x)) is not None:
            return y
        if self.fusion is not None and self.fusion.enabled:
            return self.fusion.output(self, x)
        return remote_linear(self, x)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, remote={self.spec.name!r}"


class RemoteConv1D(RemoteLayer, Conv1D):
    """transformers' Conv1D stores its weight as [in, out]; the executor handles the layout."""

    def __init__(self, spec: LayerSpec, executor: ExecutorHandle, dtype: torch.dtype,
                 device: torch.device) -> None:
        nn.Module.__init__(self)
        self.nx, self.nf = spec.in_features, spec.out_features
        self.fusion = None
        self._setup(spec, executor, (spec.in_features, spec.out_features),
                    (spec.out_features,) if spec.has_bias else None, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stage = self.stage
        if stage.passthrough:
            return x
        if stage.input is not None and (y := stage.take(x)) is not None:
            return y
        return remote_linear(self, x)

    def extra_repr(self) -> str:
        return f"nx={self.nx}, nf={self.nf}, remote={self.spec.name!r}"


class RemoteEmbedding(RemoteLayer, nn.Embedding):
    """A frozen table lookup in the executor (which also applies any scaling the model's
    embedding class does); no gradient flows into the table."""

    def __init__(self, spec: LayerSpec, executor: ExecutorHandle, dtype: torch.dtype,
                 device: torch.device, padding_idx: int | None = None) -> None:
        nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim = spec.in_features, spec.out_features
        self.padding_idx = padding_idx
        self.max_norm, self.norm_type = None, 2.0
        self.scale_grad_by_freq, self.sparse = False, False
        self._setup(spec, executor, (spec.in_features, spec.out_features), None, dtype, device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return remote_rows(self.executor, Op.FORWARD, self.spec.index, ids, current_kind(),
                           self.spec.out_features, self.weight.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, remote={self.spec.name!r}"
