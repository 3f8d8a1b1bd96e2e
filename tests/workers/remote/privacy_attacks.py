"""What an honest-but-curious executor can do with what it receives (README, "Privacy mode"):
it knows the public base weights and records every call. Each attack returns the share of the
secret it recovers, so that the same attack runs on masked and on unmasked traffic."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from executor.local import LocalExecutor
from wire.call.messages import CallKind, LayerSpec, Op
from workers.remote.build import remote_model
from workers.remote.privacy import PrivacyConfig

MAX_COMPONENTS = 64


@dataclass
class Recorder:
    """An executor handle that keeps every input it is sent (what an executor operator sees)."""

    inner: LocalExecutor
    seen: list[tuple[Op, LayerSpec, torch.Tensor]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.model, self.dtype, self.layers = self.inner.model, self.inner.dtype, self.inner.layers

    def call(self, op: Op, layer: int, x: torch.Tensor, kind: CallKind) -> torch.Tensor:
        self.seen.append((op, self.layers[layer], x.detach().clone()))
        return self.inner.call(op, layer, x, kind)

    def calls(self) -> list[tuple[Op, LayerSpec, torch.Tensor]]:
        """The calls as the model made them: a client splits a large call into several."""
        merged: list[tuple[Op, LayerSpec, torch.Tensor]] = []
        for op, spec, x in self.seen:
            if merged and merged[-1][:2] == (op, spec) and x.is_floating_point():
                merged[-1] = (op, spec, torch.cat([merged[-1][2], x]))
            else:
                merged.append((op, spec, x))
        return merged

    def rows(self, op: Op, width: int, count: int) -> list[torch.Tensor]:
        """Every call of `op` that sent `count` rows of `width` (one row per token)."""
        return [x for o, _, x in self.calls() if o == op and x.shape == (count, width)]


def wide_llama(directory: Path) -> Path:
    """A random Llama 2048 wide (vocabulary 2048: a smaller dictionary helps the attacker)."""
    config = LlamaConfig(hidden_size=2048, intermediate_size=2048, num_hidden_layers=2,
                         num_attention_heads=16, num_key_value_heads=16, vocab_size=2048,
                         max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def record(path: Path, ids: torch.Tensor, privacy: PrivacyConfig | None,
           train: bool = False) -> tuple[Recorder, torch.Tensor]:
    """Run `ids` through the split model (a training step if `train`); what the executor saw
    and the logits."""
    recorder = Recorder(LocalExecutor.load(path))
    model = remote_model(path, recorder, privacy=privacy or False, stretch=False)
    if not train:
        with torch.no_grad():
            return recorder, model(input_ids=ids).logits
    model.train()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return recorder, out.logits.detach()


def nearest(rows: torch.Tensor, dictionary: torch.Tensor) -> torch.Tensor:
    """Index of each row's nearest dictionary entry by cosine."""
    keys = torch.nn.functional.normalize(dictionary.double(), dim=1)
    rows = torch.nn.functional.normalize(rows.double(), dim=1)
    return torch.cat([(chunk @ keys.t()).argmax(dim=1) for chunk in rows.split(256)])


def layer0_dictionary(plain: LlamaForCausalLM) -> torch.Tensor:
    """Layer 0's input for every token id: the public embedding through the public norm."""
    with torch.no_grad():
        return plain.model.layers[0].input_layernorm(plain.model.embed_tokens.weight)


def layer1_dictionary(plain: LlamaForCausalLM) -> torch.Tensor:
    """The inversion attack's candidates: layer 1's attention input for a sequence's first
    token, computed for every token id by running the public base model."""
    captured: list[torch.Tensor] = []

    class Enough(Exception):
        pass

    def grab(_module, args):
        captured.append(args[0][:, 0].detach())
        raise Enough

    hook = plain.model.layers[1].self_attn.q_proj.register_forward_pre_hook(grab)
    ids = torch.arange(plain.config.vocab_size).unsqueeze(1)
    try:
        with torch.no_grad():
            for chunk in ids.split(4096):
                with contextlib.suppress(Enough):
                    plain(input_ids=chunk)
    finally:
        hook.remove()
    return torch.cat(captured)


def token_recovery(recorder: Recorder, dictionary: torch.Tensor, ids: torch.Tensor,
                   first_only: bool = False) -> float:
    """The best share of token ids recovered from any forward call by nearest-dictionary match
    (`first_only`: rows of each sequence's first token, whose inputs depend on it alone)."""
    best = 0.0
    for x in recorder.rows(Op.FORWARD, dictionary.shape[1], ids.numel()):
        rows, truth = ((x.view(*ids.shape, -1)[:, 0], ids[:, 0]) if first_only
                       else (x, ids.flatten()))
        best = max(best, (nearest(rows, dictionary) == truth).double().mean().item())
    return best


def label_recovery(recorder: Recorder, plain: LlamaForCausalLM, ids: torch.Tensor) -> float:
    """The best share of training labels recovered from any backward call: the gradient of the
    loss reaching the model's last hidden state is the output head's rows weighted by
    (probabilities - one-hot label), so the label's row stands out most negative."""
    head = plain.lm_head.weight.detach() * plain.model.norm.weight.detach()
    labels = ids[:, 1:].flatten()
    rows_with_labels = torch.ones(ids.shape, dtype=torch.bool)
    rows_with_labels[:, -1] = False
    best = 0.0
    for width, score in ((head.shape[1], lambda g: -(g.double() @ head.double().t())),
                         (head.shape[0], lambda g: -g.double())):
        for x in recorder.rows(Op.BACKWARD, width, ids.numel()):
            guess = score(x[rows_with_labels.flatten()]).argmax(dim=1)
            best = max(best, (guess == labels).double().mean().item())
    return best


def pca_cosine(received: torch.Tensor, truth: torch.Tensor) -> tuple[float, str]:
    """The attacker's best mean cosine with the true rows after removing the top m principal
    components of what it received, or after keeping only them (m up to 64)."""
    centred = received.double() - received.double().mean(0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    best = (-1.0, "")
    for m in range(MAX_COMPONENTS + 1):
        top = vh[:m]
        kept = received.double() @ top.t() @ top
        for how, cleaned in (("removed", received.double() - kept), ("kept", kept)):
            if how == "kept" and m == 0:
                continue
            cosine = torch.nn.functional.cosine_similarity(cleaned, truth.double(), dim=1)
            best = max(best, (cosine.mean().item(), f"{how} {m}"))
    return best


def plain_model(path: Path) -> LlamaForCausalLM:
    return AutoModelForCausalLM.from_pretrained(path).eval()
