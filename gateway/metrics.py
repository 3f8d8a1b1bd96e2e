"""The gateway's Prometheus metrics (one registry per app, no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
                                     "Time to the first generated token", ["tenant"], registry=r,
                                     buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
        self.fallbacks = Counter("symbiosis_fallbacks", "Responses served by the base model "
                                 "because the adapter could not be loaded", ["tenant"], registry=r)
        self.inflight = Gauge("symbiosis_inflight_requests", "Requests in progress", ["tenant"],
                              registry=r)
        self.rejected = Counter("symbiosis_rejected", "Requests refused over a tenant limit",
                                ["tenant", "reason"], registry=r)

    def render(self, status: W.StatusReply | None, jobs: dict[str, int] | None = None) -> bytes:
        lines = [generate_latest(self.registry).decode()]
        if jobs is not None:
            lines.append("# HELP symbiosis_jobs Fine-tuning jobs by status")
            lines.append("# TYPE symbiosis_jobs gauge")
            lines.extend(f'symbiosis_jobs{{status="{name}"}} {count}'
                         for name, count in sorted(jobs.items()))
        if status is not None:
            lines.append("# TYPE symbiosis_workers gauge")
            states: dict[str, int] = {}
            for worker in status.workers:
                states[worker.state] = states.get(worker.state, 0) + 1
            for state in ("starting", "ready", "stopping"):
                lines.append(f'symbiosis_workers{{state="{state}"}} {states.get(state, 0)}')
            for name, value in sorted(status.counters.items()):
                lines.append(f"# TYPE symbiosis_manager_{name}_total counter")
                lines.append(f"symbiosis_manager_{name}_total {value}")
            lines.append("# TYPE symbiosis_executor_up gauge")
            lines.append(f"symbiosis_executor_up {int(status.executor_ok)}")
            lines.append(status.executor_metrics)
        return ("\n".join(line.rstrip("\n") for line in lines if line) + "\n").encode()
