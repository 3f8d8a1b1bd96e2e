"""A bench client's end-to-end target between tokens (`--inter-token-target-ms`), paced as an
inference worker's engine paces its calls (`workers.inference.pacing`): a generate() call is a
request admitted, each token after its first one decode step of it."""

from __future__ import annotations

from typing import Any

from wire import manager as W
from workers.inference.pacing import Pacer
from workers.inference.request import Request


class PacedTokens:
    def __init__(self, client: Any, inter_token_ms: float) -> None:
        self.request = Request("bench", [], W.SamplingParams(),
                               token_targets=W.TokenTargets.from_ms(0, inter_token_ms))
        self.pacer = Pacer(lambda targets: setattr(client, "targets", targets),
                           lambda: client.calls, lambda: client.own_targets)

    def admit(self) -> None:
        """Before a generate(): its prefill, which the pacer does not time as a gap."""
        self.pacer.pace([self.request], [])

    def token(self) -> None:
        """After each token: the next one's decode step begins."""
        self.pacer.pace([], [self.request])
