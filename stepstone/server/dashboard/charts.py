"""Server-rendered SVG charts from a timeline: runs per bucket by status
(stacked bars), failure rate and queue delay (lines). This module computes
geometry; ``templates/_chart.html`` draws it. Each chart also ships its numbers
as a table for screen readers and for people who prefer reading."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from stepstone.server.dashboard.web import seconds
from stepstone.server.insights import Bucket, Timeline

WIDTH, HEIGHT = 640.0, 150.0
LEFT, BOTTOM, TOP = 48.0, 20.0, 8.0
PLOT_W, PLOT_H = WIDTH - LEFT - 4.0, HEIGHT - BOTTOM - TOP


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    tone: str
    title: str


@dataclass
class Chart:
    id: str
    title: str
    summary: str
    bars: list[Bar] = field(default_factory=list)
    lines: list[tuple[str, str, str]] = field(default_factory=list)  # (points, tone, legend)
    y_labels: list[tuple[float, str]] = field(default_factory=list)
    x_labels: list[tuple[float, str]] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)


def _clock(ts: float, width: int) -> str:
    moment = datetime.fromtimestamp(ts, UTC)
    return moment.strftime("%H:%M" if width < 86400 else "%m-%d %H:%M")


def _frame(chart: Chart, timeline: Timeline, top: float, fmt: str) -> None:
    n = len(timeline.buckets)
    chart.y_labels = [(TOP + PLOT_H * (1 - f), fmt.format(top * f)) for f in (0.0, 0.5, 1.0)]
    for i in sorted({0, n // 2, n - 1}):
        chart.x_labels.append((LEFT + PLOT_W * i / n, _clock(timeline.buckets[i].start, timeline.width)))


def throughput(timeline: Timeline) -> Chart:
    chart = Chart(
        "throughput",
        "Runs created",
        "Runs created per interval, by status now",
        columns=["from (UTC)", "completed", "failed", "cancelled", "active"],
        legend=[("ok", "completed"), ("failed", "failed"), ("cancelled", "cancelled"), ("running", "active")],
    )
    top = max([b.created for b in timeline.buckets] + [1])
    step = PLOT_W / len(timeline.buckets)
    for i, b in enumerate(timeline.buckets):
        active = b.created - b.ended
        y = TOP + PLOT_H
        for tone, count in (
            ("ok", b.completed),
            ("failed", b.failed),
            ("cancelled", b.cancelled),
            ("running", active),
        ):
            if count:
                h = PLOT_H * count / top
                y -= h
                chart.bars.append(
                    Bar(
                        round(LEFT + i * step + 0.5, 2),
                        round(y, 2),
                        round(max(step - 1, 0.5), 2),
                        round(h, 2),
                        tone,
                        f"{_clock(b.start, timeline.width)}: {count} {tone}",
                    )
                )
        if b.created:
            chart.rows.append(
                [
                    _clock(b.start, timeline.width),
                    str(b.completed),
                    str(b.failed),
                    str(b.cancelled),
                    str(active),
                ]
            )
    _frame(chart, timeline, top, "{:.0f}")
    return chart


def _points(timeline: Timeline, values: list[float | None], top: float) -> str:
    step = PLOT_W / len(values)
    return " ".join(
        f"{LEFT + step * (i + 0.5):.1f},{TOP + PLOT_H * (1 - v / top):.1f}"
        for i, v in enumerate(values)
        if v is not None
    )


def failure_rate(timeline: Timeline) -> Chart:
    chart = Chart(
        "failures",
        "Failure rate",
        "Failed runs among the ended runs created per interval",
        columns=["from (UTC)", "failed", "ended", "rate"],
        legend=[("failed", "failure rate")],
    )
    values = [None if b.failure_rate is None else b.failure_rate * 100 for b in timeline.buckets]
    chart.lines.append((_points(timeline, values, 100.0), "failed", "failure rate"))
    chart.rows = [
        [_clock(b.start, timeline.width), str(b.failed), str(b.ended), f"{(b.failure_rate or 0) * 100:.0f}%"]
        for b in timeline.buckets
        if b.ended
    ]
    _frame(chart, timeline, 100.0, "{:.0f}%")
    return chart


def queue_delay(timeline: Timeline) -> Chart:
    chart = Chart(
        "delay",
        "Queue delay",
        "Seconds from creation to first start, per interval",
        columns=["from (UTC)", "started", "average", "max"],
        legend=[("running", "average"), ("retrying", "max")],
    )
    averages = [b.delay_avg for b in timeline.buckets]
    maxima = [b.delay_max for b in timeline.buckets]
    top = max([v for v in maxima if v is not None] + [0.001])
    chart.lines.append((_points(timeline, maxima, top), "retrying", "max"))
    chart.lines.append((_points(timeline, averages, top), "running", "average"))
    chart.rows = [
        [_clock(b.start, timeline.width), str(b.started), seconds(b.delay_avg), seconds(b.delay_max)]
        for b in timeline.buckets
        if b.started
    ]
    _frame(chart, timeline, top, "{:.2g} s")
    return chart


def all_charts(timeline: Timeline) -> list[Chart]:
    return [throughput(timeline), failure_rate(timeline), queue_delay(timeline)]


def has_data(buckets: list[Bucket]) -> bool:
    return any(b.created for b in buckets)
