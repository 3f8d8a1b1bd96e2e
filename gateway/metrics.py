"""The gateway's Prometheus metrics (one registry per app, no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.status_metrics import StatusCollector
from wire import manager as W


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("symbiosis_requests", "HTTP requests",
                                ["route", "status", "tenant"], registry=r)
        self.latency = Histogram("symbiosis_request_seconds", "HTTP request latency", ["route"],
                                 registry=r)
        self.tokens = Counter("symbiosis_tokens", "Tokens processed, by the model and version "
                              "that answered", ["tenant", "model", "version", "kind"],
                              registry=r)
        self.responses = Counter("symbiosis_responses", "Completions served, by the model and "
                                 "version that answered", ["tenant", "model", "version"],
                                 registry=r)
        self.first_token = Histogram("symbiosis_time_to_first_token_seconds",
                                     "Time from a request's arrival to its first generated "
                                     "token reaching the gateway, streamed or not, by service "
                                     "tier (default, flex)", ["tenant", "tier"], registry=r,
                                     buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
        self.inter_token = Histogram("symbiosis_inter_token_seconds",
                                     "Time between two consecutive generated tokens of one "
                                     "sequence reaching the gateway, by service tier",
                                     ["tenant", "tier"], registry=r,
                                     buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1,
                                              2.5))
        self.token_targets = Counter("symbiosis_token_targets", "Generated tokens timed against "
                                     "their tenant's own end-to-end target (the first token's "
                                     "against ttft_target_ms, each other against "
                                     "inter_token_target_ms), met or not",
                                     ["tenant", "target", "met"], registry=r)
        self.fallbacks = Counter("symbiosis_fallbacks", "Responses served by the base model "
                                 "because the adapter could not be loaded", ["tenant"], registry=r)
        self.inflight = Gauge("symbiosis_inflight_requests", "Requests in progress", ["tenant"],
                              registry=r)
        self.rejected = Counter("symbiosis_rejected", "Requests refused over a tenant limit "
                                "(or a conversation's turn another response holds)",
                                ["tenant", "reason"], registry=r)
        self.stored = Counter("symbiosis_stored_responses", "Responses API answers asked to be "
                              "kept (`store`), kept or not (the manager could not)",
                              ["tenant", "kept"], registry=r)
        self.stored_chats = Counter("symbiosis_stored_chat_completions", "Chat completions "
                                    "asked to be kept (`store`), kept or not", ["tenant", "kept"],
                                    registry=r)
        self.turns = Counter("symbiosis_conversation_turns", "Responses done in a "
                             "conversation, their input and output added to it or not (the "
                             "conversation deleted meanwhile, the quota)", ["tenant", "added"],
                             registry=r)
        self.batch_requests = Counter("symbiosis_batch_requests", "Batch requests answered, by "
                                      "the endpoint's status", ["tenant", "status"], registry=r)
        self.background = Counter("symbiosis_background_responses", "Background responses "
                                  "whose run ended, by how they ended (completed, incomplete, "
                                  "failed, cancelled, deleted)", ["tenant", "status"],
                                  registry=r)

    def render(self, status: W.StatusReply | None, jobs: dict[str, int] | None = None) -> bytes:
        """The gateway's own metrics, then the manager's status and the jobs, this scrape's."""
        scrape = CollectorRegistry(auto_describe=False)
        scrape.register(StatusCollector(status, jobs))
        return generate_latest(self.registry) + generate_latest(scrape)
