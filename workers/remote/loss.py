"""The head's loss on the trainer's side: the output head, the token loss and its gradient in one
executor call (`executor.loss`), so that the logits never cross the link nor live here.

`enable_head_loss` gives a model's remote output head a `HeadLoss` where the executor offers
`<head>+loss` and the architecture returns the head's output as its logits
(`catalogue.stretches`). A step or an evaluation asks `head_loss(model)` each time: it answers
while the head is still the model's output layer as it is (an adapter that wraps the head, as
LoRA on `lm_head` does, keeps the logits path; `modules_to_save` cannot copy a remote head at
all). Inside `passing()` the head hands its input through, so the model's "logits" are its final
hidden states (and, given the labels, the last decoder layer computes after its attention only
the rows whose next token is trained: `workers.remote.trained_rows`); `__call__` sends them
with the labels and returns the summed token loss, the count of trained labels and of right
answers. While autograd records, the loss is one autograd node whose backward is the gradient
the call brought, scaled; otherwise (an evaluation) the call goes to `<head>+eval`, which
computes no gradient. Privacy mode never enables it: the labels would reach the executor.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

from catalogue.stretches import RECIPES
from wire.call.digits import DIGITS, as_digits
from wire.call.messages import CallKind, LayerKind, LayerSpec, Op
from workers.remote.handle import ExecutorHandle
from workers.remote.layers import RemoteLayer, remote_rows
from workers.remote.trained_rows import TrainedRows, enable_trained_rows


class HeadLoss:
    """The model's `<head>+loss` call (`spec`) and `<head>+eval` call (`evaluation`) for its
    remote output head `head`."""

    def __init__(self, model: nn.Module, head: RemoteLayer, spec: LayerSpec,
                 evaluation: LayerSpec, handle: ExecutorHandle, rows: TrainedRows) -> None:
        self.model, self.head, self.handle, self.rows = model, head, handle, rows
        self.spec, self.evaluation = spec, evaluation
        self.vocabulary = head.spec.out_features

    def usable(self) -> bool:
        return self.model.get_output_embeddings() is self.head

    @contextmanager
    def passing(self, labels: torch.Tensor | None = None) -> Iterator[None]:
        """The head hands its input through: the model's logits are its final hidden states;
        given the batch's `labels` ([batch, length]), only the rows a label after them trains."""
        self.head.stage.passthrough = True
        try:
            with self.rows.only(self._wanted(labels)) if labels is not None else nullcontext():
                yield
        finally:
            self.head.stage.passthrough = False

    def _wanted(self, labels: torch.Tensor) -> torch.Tensor:
        wanted = torch.zeros_like(labels, dtype=torch.bool)
        wanted[:, :-1] = self.trained(labels[:, 1:])
        return wanted

    def trained(self, labels: torch.Tensor) -> torch.Tensor:
        return (labels >= 0) & (labels < self.vocabulary)

    def __call__(self, hidden: torch.Tensor, labels: torch.Tensor
                 ) -> tuple[torch.Tensor, int, int]:
        """hidden [..., width], labels [...] (negative: ignored) -> (the token losses' sum, while
        autograd records an autograd node of `hidden`; the labels trained; the right answers).
        Only the rows of trained labels go to the executor: an ignored row's loss and gradient
        are zero, and a chat job's prompt and a batch's padding make many rows of a step."""
        trained = self.trained(labels)
        count = int(trained.sum())
        step = torch.is_grad_enabled()
        if count == 0:  # nothing here is learned: no call
            total = hidden.new_zeros((), dtype=torch.float32)
            return (_LossFn.apply(hidden, total, torch.zeros_like(hidden)) if step else total,
                    0, 0)
        parts, rows = self._call(hidden, labels, trained, count, step)
        total, right = parts[:, :2].sum(), int(parts[:, 2].sum())
        if rows is None:
            return total, count, right
        if count == trained.numel():
            grad = rows.to(hidden.dtype, copy=True).reshape(hidden.shape)
        else:
            grad = torch.zeros_like(hidden)
            grad[trained] = rows.to(hidden.dtype)
        return _LossFn.apply(hidden, total, grad), count, right

    def row_losses(self, hidden: torch.Tensor, labels: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [..., width], labels [...] -> (each trained label's token loss, [trained], in
        float32: minus its log-probability; while autograd records an autograd node of
        `hidden`), the mask of the trained labels [...]. For a loss of each sequence's sum
        (DPO's): the call answers each row's loss and its gradient, which the backward scales
        row by row."""
        trained = self.trained(labels)
        count = int(trained.sum())
        step = torch.is_grad_enabled()
        if count == 0:  # nothing here is learned: no call
            none = hidden.new_zeros(0, dtype=torch.float32)
            return (_RowLossFn.apply(hidden, none, hidden.new_zeros(0, hidden.shape[-1]),
                                     trained) if step else none), trained
        parts, rows = self._call(hidden, labels, trained, count, step)
        losses = parts[:, :2].sum(1)
        if rows is None:
            return losses, trained
        return _RowLossFn.apply(hidden, losses, rows.to(hidden.dtype, copy=True),
                                trained), trained

    def _call(self, hidden: torch.Tensor, labels: torch.Tensor, trained: torch.Tensor,
              count: int, step: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The `count` trained rows through `<head>+loss` (`step`) or `<head>+eval`: ([rows, 3]
        in float32, copied out of the call's answer: the loss, its remainder, right; with
        `step`, [rows, width] the loss's gradient for those rows, the answer itself: read it
        before the next call, which may reuse it)."""
        every, width = count == trained.numel(), hidden.shape[-1]
        x = hidden.new_empty(count, width + DIGITS)
        if every:
            x.view(*hidden.shape[:-1], -1)[..., :width] = hidden.detach()
        else:
            x[:, :width] = hidden.detach()[trained]
        x[:, width:] = as_digits((labels if every else labels[trained]).reshape(-1).to(x.device),
                                 x.dtype)
        spec = self.spec if step else self.evaluation
        y = remote_rows(self.handle, Op.FORWARD, spec.index, x, CallKind.TRAINING,
                        spec.out_features, x.dtype, fresh=False)
        return y[:, :3].float(), y[:, 3:] if step else None


class _LossFn(torch.autograd.Function):
    """The loss the call computed, with the gradient it brought for `hidden`."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, total: torch.Tensor, grad: torch.Tensor):
        ctx.grad = grad
        return total.clone()

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad, ctx.grad = ctx.grad, None
        return grad * grad_loss.to(grad.dtype), None, None


class _RowLossFn(torch.autograd.Function):
    """Each trained row's loss the call computed, with the gradient it brought for that row of
    `hidden` (`trained`: where the rows are)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, losses: torch.Tensor, rows: torch.Tensor,
                trained: torch.Tensor):
        ctx.rows, ctx.trained = rows, trained
        return losses.clone()

    @staticmethod
    def backward(ctx, grad_losses: torch.Tensor):
        rows, trained = ctx.rows, ctx.trained
        ctx.rows = ctx.trained = None
        grad = rows.new_zeros(*trained.shape, rows.shape[-1])
        grad[trained] = rows * grad_losses.to(rows.dtype)[:, None]
        return grad, None, None, None


def enable_head_loss(model: nn.Module, handle: ExecutorHandle) -> HeadLoss | None:
    """Install the head's loss in `model` (call before adapters wrap it) where the executor
    offers it for this model's head and the architecture leaves the logits as the head gives
    them; None otherwise."""
    recipe = RECIPES.get(getattr(model.config, "model_type", ""))
    if recipe is None:
        return None
    head = model.get_output_embeddings()
    specs = {s.name: s for s in handle.layers}
    step, evaluation = specs.get(f"{recipe.head}+loss"), specs.get(f"{recipe.head}+eval")
    if not isinstance(head, RemoteLayer) or head is not model.get_submodule(recipe.head) \
            or step is None or evaluation is None \
            or any(s.kind != LayerKind.LOSS or s.in_features != head.spec.in_features + DIGITS
                   for s in (step, evaluation)):
        return None
    model.symbiosis_head_loss = HeadLoss(model, head, step, evaluation, handle,
                                         enable_trained_rows(model, recipe))
    return model.symbiosis_head_loss


def head_loss(model: nn.Module) -> HeadLoss | None:
    """The head's loss installed in `model` (or the model an adapter wraps), where a step may use
    it now."""
    loss = getattr(model, "symbiosis_head_loss", None)
    return loss if loss is not None and loss.usable() else None
