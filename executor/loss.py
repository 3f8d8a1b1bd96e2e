"""The head's loss: the output head, the token loss, its accuracy and its gradient, in one call.

A trainer whose output head is frozen and untouched by adapters needs the logits only for the
loss and for their gradient: it sends `<head>+loss` its final hidden states with each row's
label (base-256 digits, `wire.call.digits`) and gets back, per row, the token loss (as a sum of
two parts, exact in bfloat16 to ~16 bits), whether the head's greedy choice is the label, and
the loss's gradient for the hidden states. Neither the logits nor their gradient cross the link
or live in the trainer: a 50k vocabulary's logits are 200 KB a row in float32, twice over with
the log-probabilities a loss keeps. A row whose label is outside the vocabulary (the trainer's
ignored positions) gives zeros.

The same arithmetic as a trainer's over the logits the head call returns: the logits in the
executor's dtype, then in float32 the log-sum-exp, the loss, softmax minus one-hot, and that
gradient back in the executor's dtype through the head's weight. Rows go through in chunks
(`CHUNK_BYTES` of float32 logits each on a CPU, `DEVICE_CHUNK_BYTES` on a GPU, whose matmuls
want thousands of rows), so a call of thousands of rows never holds all its logits at once.
"""

from __future__ import annotations

import torch

from executor.kernels import linear, linear_into
from wire.call.digits import DIGITS, greedy_choices, ids_of
from wire.call.messages import LayerKind, LayerSpec

CHUNK_BYTES = 64 * 2**20
DEVICE_CHUNK_BYTES = 2**30
PARTS = 3  # the loss's two parts, the right answer


class HeadLoss:
    """[rows, hidden + DIGITS] -> [rows, 3 + hidden]: [loss | its remainder | right | gradient];
    without `gradient` (an evaluation's) [rows, 3], and the gradient's product is never made."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 gradient: bool = True, room: Room | None = None) -> None:
        self.weight, self.bias, self.gradient = weight, bias, gradient
        self.room = room or Room()
        self.vocabulary, self.hidden = weight.shape
        self.width = PARTS + (self.hidden if gradient else 0)
        chunk_bytes = CHUNK_BYTES if weight.device.type == "cpu" else DEVICE_CHUNK_BYTES
        self.chunk = max(1, chunk_bytes // (4 * self.vocabulary))

    @property
    def macs_per_row(self) -> int:  # the head forward, and the gradient's product
        return (2 if self.gradient else 1) * self.vocabulary * self.hidden

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty(x.shape[0], self.width)
        self.into(x, out)
        return out

    def into(self, x: torch.Tensor, out: torch.Tensor) -> None:
        labels = ids_of(x[:, self.hidden:], self.vocabulary)
        for start in range(0, x.shape[0], self.chunk):
            stop = min(start + self.chunk, x.shape[0])
            self._rows(x[start:stop, :self.hidden], labels[start:stop], out[start:stop])

    def _rows(self, h: torch.Tensor, labels: torch.Tensor, out: torch.Tensor) -> None:
        """Over the logits in place: their largest, e^(logit - largest), its sum (the log-sum-exp
        as torch's: log(sum) + largest), and the softmax by that sum, which is the gradient once
        the label's one is taken off; five passes over the chunk's logits, no second copy."""
        logits = self._logits(h)
        valid = labels >= 0
        safe = labels.clamp(min=0)
        picked = logits.gather(1, safe[:, None])[:, 0]
        top = logits.amax(dim=1)
        right = self._right(logits, picked, top, labels, valid)
        top.masked_fill_(top.isinf(), 0.0)  # as torch's logsumexp: an infinite row stays so
        exps = logits.sub_(top[:, None]).exp_()
        total = exps.sum(dim=1)
        loss = (total.log() + top - picked).where(valid, 0.0)
        high = loss.to(out.dtype)
        out[:, 0] = high
        out[:, 1] = (loss - high.float()).to(out.dtype)
        out[:, 2] = right.to(out.dtype)
        if not self.gradient:
            return
        grad = exps.div_(total[:, None])  # the softmax, in the logits' place
        grad[torch.arange(len(safe), device=safe.device), safe] -= 1.0
        if not bool(valid.all()):
            grad[~valid] = 0.0
        torch.mm(grad.to(out.dtype), self.weight, out=out[:, PARTS:])

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """The chunk's logits in float32: on a CPU in float32 written into the room kept between
        calls (a chunk's are up to `CHUNK_BYTES`, which malloc would map afresh each call and
        the kernel fill with zeroed pages)."""
        if h.device.type != "cpu" or self.weight.dtype != torch.float32:
            return linear(h, self.weight, self.bias).float()
        logits = self.room.take(h.shape[0], self.vocabulary)
        linear_into(h, self.weight, self.bias, logits)
        return logits

    @staticmethod
    def _right(logits: torch.Tensor, picked: torch.Tensor, top: torch.Tensor,
               labels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Whether each row's greedy choice (its first largest logit) is its label: only a row
        whose label's logit is the largest can be right, and only those rows are searched (all
        of them in place where they are most)."""
        right = valid & (picked == top)
        rows = right.nonzero()[:, 0]
        if 2 * len(rows) > len(right):
            return right & (greedy_choices(logits).to(labels.device) == labels)
        if len(rows):
            right[rows] = greedy_choices(logits[rows]).to(labels.device) == labels[rows]
        return right


class Room:
    """Float32 memory for a head's logits, grown to the most rows asked for (at most a chunk's)
    and kept: the head's training and evaluation ops share one."""

    def __init__(self) -> None:
        self._memory = torch.empty(0, dtype=torch.float32)

    def take(self, rows: int, width: int) -> torch.Tensor:
        if self._memory.numel() < rows * width:
            self._memory = torch.empty(rows * width, dtype=torch.float32)
        return self._memory[:rows * width].view(rows, width)


def build(index: int, head: LayerSpec, weight: torch.Tensor,
          bias: torch.Tensor | None) -> list[tuple[LayerSpec, HeadLoss]]:
    """For a head layer (its weight [vocabulary, hidden]): `<head>+loss` at `index`, with the
    hidden states' gradient (a training step's), and `<head>+eval` after it, without (an
    evaluation's)."""
    hidden, members = head.in_features, (head.name,)
    step = LayerSpec(index, f"{head.name}+loss", LayerKind.LOSS, hidden + DIGITS,
                     PARTS + hidden, False, members=members, splits=(2, 1, hidden))
    evaluation = LayerSpec(index + 1, f"{head.name}+eval", LayerKind.LOSS, hidden + DIGITS,
                           PARTS, False, members=members, splits=(2, 1))
    room = Room()
    return [(step, HeadLoss(weight, bias, room=room)),
            (evaluation, HeadLoss(weight, bias, False, room))]
