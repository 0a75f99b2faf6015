"""Prometheus metrics: the objects the engine updates, and the ``/metrics`` text.

Counters and histograms live in this process's ``REGISTRY`` (not the global
default one, so importing Stepstone never pollutes an application's registry).
The engine records through the small functions below; gauges that describe the
whole database (backlog, active runs) are computed from the store at scrape
time by ``render``. ``prometheus_client`` comes with the ``server`` extra;
without it recording does nothing. It is imported when a worker starts (or at
the first record or scrape), not with Stepstone: a process that never records
(a serverless host's cold start, a client) does not pay for it and for what it
imports (``http.server``, ``urllib.request``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stepstone.store.viewrows import BacklogRow, RunCountRow

_DELAY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)


class _Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.runs_started = Counter(
            "stepstone_runs_started",
            "Runs that began executing (first lease), by function",
            ["function"],
            registry=self.registry,
        )
        self.runs_finished = Counter(
            "stepstone_runs_finished",
            "Runs that ended, by function and final status",
            ["function", "status"],
            registry=self.registry,
        )
        self.step_duration = Histogram(
            "stepstone_step_duration_seconds",
            "step.run durations, from the step's first start to its end, by function",
            ["function"],
            registry=self.registry,
        )
        self.queue_delay = Histogram(
            "stepstone_queue_delay_seconds",
            "From a run's creation to its first start, by function",
            ["function"],
            buckets=_DELAY_BUCKETS,
            registry=self.registry,
        )
        self.abandoned_threads = Gauge(
            "stepstone_abandoned_step_threads",
            "Threads of sync steps abandoned past their timeout that have not returned yet",
            registry=self.registry,
        )
        self.pruned = Counter(
            "stepstone_pruned_rows",
            "Rows deleted by retention and by the pruning of expired keys and cells, by table",
            ["table"],
            registry=self.registry,
        )


_metrics: _Metrics | None = None  # set by ``load``, with ``_loaded``
_loaded = False
_load_lock = threading.Lock()


def load() -> _Metrics | None:
    """The process's metrics, created once (``None``: the server extra is not
    installed). A worker calls it as it starts, so its first run does not pay
    the import."""
    global _metrics, _loaded
    with _load_lock:
        if not _loaded:
            try:
                _metrics = _Metrics()
            except ImportError:  # pragma: no cover - the server extra is not installed
                _metrics = None
            _loaded = True
    return _metrics


_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: Any, *values: str) -> Any:
    """``metric.labels(*values)``, asked once per label values: prometheus_client
    checks and converts the values and takes a lock at every call, and a run
    records six (its children are never removed, so the same one comes back)."""
    key = (metric, *values)
    child = _children.get(key)
    if child is None:
        child = _children[key] = metric.labels(*values)
    return child


def run_started(function_id: str, queue_delay: float) -> None:
    if (metrics := _metrics if _loaded else load()) is not None:
        _child(metrics.runs_started, function_id).inc()
        _child(metrics.queue_delay, function_id).observe(max(0.0, queue_delay))


def run_finished(function_id: str, status: str) -> None:
    if (metrics := _metrics if _loaded else load()) is not None:
        _child(metrics.runs_finished, function_id, status).inc()


def step_finished(function_id: str, seconds: float) -> None:
    if (metrics := _metrics if _loaded else load()) is not None:
        _child(metrics.step_duration, function_id).observe(max(0.0, seconds))


def abandoned_threads(delta: int) -> None:
    if (metrics := _metrics if _loaded else load()) is not None:
        metrics.abandoned_threads.inc(delta)


def pruned(counts: Mapping[str, int]) -> None:
    if (metrics := _metrics if _loaded else load()) is not None:
        for table, n in counts.items():
            if n:
                metrics.pruned.labels(table).inc(n)


@dataclass(frozen=True)
class StoreSnapshot:
    """What the store says at scrape time."""

    now: float
    backlog: Sequence[BacklogRow]
    active: Sequence[RunCountRow]


class _SnapshotCollector:
    def __init__(self, snapshot: StoreSnapshot) -> None:
        self.snapshot = snapshot

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        snap = self.snapshot
        backlog = GaugeMetricFamily(
            "stepstone_backlog", "Runs due and waiting for a worker", labels=["function"]
        )
        oldest = GaugeMetricFamily(
            "stepstone_backlog_oldest_seconds",
            "Age of the oldest due run waiting for a worker",
            labels=["function"],
        )
        for row in snap.backlog:
            backlog.add_metric([row.function_id], row.due)
            oldest.add_metric([row.function_id], max(0.0, snap.now - row.oldest_due_at))
        active = GaugeMetricFamily(
            "stepstone_runs_active", "Runs not yet ended, by status", labels=["function", "status"]
        )
        for count in snap.active:
            active.add_metric([count.function_id, count.status], count.count)
        yield from (backlog, oldest, active)


def render(snapshot: StoreSnapshot) -> bytes:
    """The Prometheus text exposition: this process's counters plus store gauges."""
    from prometheus_client import CollectorRegistry, generate_latest

    gauges = CollectorRegistry()
    gauges.register(_SnapshotCollector(snapshot))
    metrics = load()
    own = generate_latest(metrics.registry) if metrics is not None else b""
    return own + generate_latest(gauges)


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def serve(host: str, port: int, health: Callable[[], dict[str, Any]]) -> None:
    """A worker's ``--metrics-port``, on a daemon thread: ``/metrics`` (this
    process's counters and histograms; the database gauges come from the
    server's ``/metrics``), ``/healthz`` (the process answers) and ``/readyz``
    (``health()``: 200 when it says ready, else 503; JSON either way)."""
    metrics = load()
    if metrics is None:
        raise RuntimeError("prometheus-client is not installed (pip install 'stepstone[server]')")
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from prometheus_client import generate_latest

    registry = metrics.registry

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE, generate_latest(registry))
            elif path == "/healthz":
                self._send(200, "application/json", b'{"status": "ok"}')
            elif path == "/readyz":
                state = health()
                self._send(200 if state["ready"] else 503, "application/json", json.dumps(state).encode())
            else:
                self._send(404, "text/plain", b"not found: /metrics, /healthz or /readyz\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # probes are not news
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="stepstone-metrics", daemon=True).start()
