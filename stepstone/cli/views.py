"""Read-only views the CLI shows from either target: the event log
(``stepstone events list``), the queue backlog (``stepstone queue``) and runs
found by a CEL condition over their event (``runs list --if``).

Each is read from the database through the server's own view operations, or
from a server through the endpoint built on them, and comes back in the same
response models, so both targets print the same thing.
"""

from __future__ import annotations

from stepstone.app import App
from stepstone.client import Client
from stepstone.expressions import compile_expression
from stepstone.runs import Run
from stepstone.server import insights
from stepstone.server.routes.event_log import with_runs
from stepstone.server.schemas import RunPage
from stepstone.server.search import EventQuery, search_op
from stepstone.server.view_schemas import EventOut, EventPage, FunctionLoadList, FunctionLoadOut
from stepstone.store.rows import RunFilter


def events(target: App | Client, name: str | None, event_id: str | None, limit: int) -> list[EventOut]:
    """The event log, newest first, each event with the runs it started."""
    if isinstance(target, Client):
        params = {"name": name, "event_id": event_id, "limit": limit}
        return EventPage.model_validate(target.call("GET", "/api/v1/events", params=params)).events
    return target.store.read_sync(lambda tx: with_runs(tx, tx.list_events(name, event_id, None, limit)))


def loads(target: App | Client) -> list[FunctionLoadOut]:
    """Every registered function with its queue backlog per concurrency key."""
    if isinstance(target, Client):
        return FunctionLoadList.model_validate(target.call("GET", "/api/v1/stats/functions")).functions
    found = target.store.read_sync(insights.functions_op(target.clock.now()))
    return [FunctionLoadOut.of(load) for load in found]


def runs_where(target: App | Client, where: RunFilter, condition: str, limit: int) -> list[Run]:
    """Runs matching the filters whose first event satisfies ``condition`` (CEL),
    newest first; like the API, a bounded number of runs is examined."""
    if isinstance(target, Client):
        params = {
            "function_id": where.function_id,
            "status": list(where.statuses) or None,
            "event_id": where.event_id,
            "since": where.since,
            "until": where.until,
            "limit": limit,
            "if": condition,
        }
        page = RunPage.model_validate(target.call("GET", "/api/v1/runs", params=params))
        return [r.to_run() for r in page.runs]
    query = EventQuery(None, compile_expression(condition, field="if"))
    return target.store.read_sync(search_op(where, query, limit)).runs
