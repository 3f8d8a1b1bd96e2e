"""The measured loops of a benchmark client (`bench.workload`), one per kind of work: each runs
until the window closes and returns each unit's latency and when the last unit ended."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from bench.models import FIXED_LENGTH
from bench.paced import PacedTokens


def settle(device: torch.device) -> None:
    """Wait for the device's queued work, so that a unit of work is timed when it is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


HELD_MAX_S = 600.0  # a held client's window closes this long after `until` at the latest


@dataclass(frozen=True)
class Window:
    """When a decode client's window closes: at `until`, or for a held client (`release`: its
    group's release file) only once its group releases it after that, so that what the group's
    other clients measure runs beside it throughout (a mixed scenario's jobs make their steps
    beside decoding tenants, `bench.group`)."""

    until: float
    release: Path | None = None

    def closed(self, now: float) -> bool:
        if now < self.until:
            return False
        return self.release is None or now >= self.until + HELD_MAX_S or self.release.exists()


class TokenClock(StoppingCriteria):
    """Stamps each generated token and ends the generation when the window closes, so a
    client's last generate() does not run past the measured window."""

    def __init__(self, until: float | Window, paced: PacedTokens | None = None) -> None:
        self.window = until if isinstance(until, Window) else Window(until)
        self.stamps: list[float] = []
        self.paced = paced  # the client's end-to-end target between tokens, if it asks one

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        now = time.monotonic()
        self.stamps.append(now)
        if self.paced is not None:
            self.paced.token()
        return torch.full((input_ids.shape[0],), self.window.closed(now), dtype=torch.bool,
                          device=input_ids.device)  # transformers ands it with a tensor there

    @property
    def last(self) -> float:
        """When the last token came (now, if none has)."""
        return self.stamps[-1] if self.stamps else time.monotonic()

    def generate(self, model, ids: torch.Tensor, tokens: int, **kwargs) -> list[float]:
        """One generate(); the gap before each of its tokens (the first: since the start)."""
        if self.paced is not None:
            self.paced.admit()
        self.stamps = [time.monotonic()]
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=tokens, **FIXED_LENGTH,
                           stopping_criteria=StoppingCriteriaList([self]), **kwargs)
        return [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]


def decode(model, prompt: int, tokens: int, until: float | Window, rng: torch.Generator,
           first: bool = True, paced: PacedTokens | None = None
           ) -> tuple[list[float], float, list[float]]:
    """generate() calls until the window closes: each token's latency, when the last came, and
    each call's time to its first token. `first=False` leaves out each call's first token from
    the latencies (it also paid the prefill)."""
    model.eval()
    clock, latencies, firsts = TokenClock(until, paced), [], []
    while not clock.window.closed(clock.last):  # at a token: the last comes once it is closed
        ids = torch.randint(0, 50000, (1, prompt), generator=rng).to(model.device)
        gaps = clock.generate(model, ids, tokens)
        firsts += gaps[:1]
        latencies += gaps[0 if first else 1:]
    return latencies, clock.last, firsts


def decode_mixed(model, n: int, prompt: int, tokens: int, until: float,
                 rng: torch.Generator) -> tuple[list[float], float]:
    """generate() over n sequences, each with its own adapter; per-sequence token latency."""
    model.eval()
    names = [f"a{i}" for i in range(n)]
    clock, latencies = TokenClock(until), []
    while not clock.window.closed(clock.last):  # as `decode`: the window closes at a token
        ids = torch.randint(0, 50000, (n, prompt), generator=rng).to(model.device)
        latencies += [gap for gap in clock.generate(model, ids, tokens, adapter_names=names)
                      for _ in range(n)]
    return latencies, clock.last


def prefill(model, length: int, until: float,
            rng: torch.Generator) -> tuple[list[float], float]:
    model.eval()
    latencies = []
    while time.monotonic() < until:
        ids = torch.randint(0, 50000, (1, length), generator=rng).to(model.device)
        started = time.perf_counter()
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
        settle(model.device)
        latencies.append(time.perf_counter() - started)
    return latencies, time.monotonic()


def calls(endpoint: str, layer_name: str, until: float) -> tuple[list[float], float, int]:
    """1-row executor calls on one layer, back to back: each call's round trip."""
    from wire.call.messages import CallKind, Op
    from workers.remote.client import ExecutorClient

    client = ExecutorClient(endpoint, name="calls")
    layer = next(s for s in client.layers if s.name.endswith(layer_name))
    x = torch.randn(1, layer.in_features)
    for _ in range(20):
        client.call(Op.FORWARD, layer.index, x, CallKind.INFERENCE)
    latencies = []
    while (now := time.monotonic()) < until:
        started = time.perf_counter()
        client.call(Op.FORWARD, layer.index, x, CallKind.INFERENCE)
        latencies.append(time.perf_counter() - started)
    client.close()
    return latencies, now, 1


def train(model, batch: int, length: int, until: float, rng: torch.Generator,
          least: int = 0) -> tuple[list[float], float]:
    """A Trainer-style loop: AdamW, labels = inputs, gradient clipping; steps until the window
    closes and at least `least` of them."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    model.train()
    latencies = []
    while time.monotonic() < until or len(latencies) < least:
        ids = torch.randint(0, 50000, (batch, length), generator=rng).to(model.device)
        latencies.append(train_step(model, optimizer, params, ids))
    return latencies, time.monotonic()


def train_chat(model, examples: list, pad_id: int, batch: int,
               until: float) -> tuple[list[float], float, float]:
    """Steps over a chat dataset, as a job's see one: `batch` examples a step in file order (only
    the assistant's tokens trained, `workers.training.data`), AdamW, clipping. Ours by the
    trainer's own step (`workers.training.loop.train_step`: micro-batches of like lengths, the
    executor's head loss); plain as a Trainer-style loop does, the batch right-padded in one
    piece. (step seconds, when the last step ended, tokens a step: the examples' own)."""
    from workers.training import loop
    from workers.training.data import collate

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    hp = loop.Hyperparameters(1, batch, 1e-4, warmup_ratio=0.0)
    ours = getattr(model, "symbiosis_executor", None) is not None
    model.train()
    latencies, tokens = [], 0
    while time.monotonic() < until:
        start = len(latencies) * batch
        group = [examples[(start + i) % len(examples)] for i in range(batch)]
        started = time.perf_counter()
        if ours:
            loop.train_step(model, group, pad_id, optimizer, schedule, hp)
        else:
            tensors = {name: t.to(model.device) for name, t in collate(group, pad_id).items()}
            model(**tensors).loss.backward()
            torch.nn.utils.clip_grad_norm_(params, hp.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
        settle(model.device)
        latencies.append(time.perf_counter() - started)
        tokens += sum(len(e.ids) for e in group)
    return latencies, time.monotonic(), tokens / max(len(latencies), 1)


def mean_loss(model, ids: torch.Tensor) -> torch.Tensor:
    """The mean token loss of labels = inputs: on our side, where the model has the executor's
    head loss, by our trainer's own loss (`workers.training.loop.token_losses`, which goes
    through it); else transformers' own."""
    if getattr(model, "symbiosis_executor", None) is not None:
        from workers.remote.loss import head_loss
        from workers.training.loop import token_losses

        if head_loss(model) is not None:
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
            loss, count, _ = token_losses(model, batch)
            return loss / count
    return model(input_ids=ids, labels=ids).loss


def train_step(model, optimizer, params, ids: torch.Tensor) -> float:
    """One step of `train`, timed until the device is done: labels = inputs, clipping."""
    started = time.perf_counter()
    mean_loss(model, ids).backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    optimizer.zero_grad()
    settle(ids.device)
    return time.perf_counter() - started
