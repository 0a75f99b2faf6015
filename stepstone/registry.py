"""The function registry: which functions exist and which events trigger them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stepstone.errors import ConfigError
from stepstone.flow import FlowConfig
from stepstone.function import FunctionDef
from stepstone.triggers import on_event

FAILED_EVENT = "stepstone/function.failed"
FINISHED_EVENT = "stepstone/function.finished"
CANCELLED_EVENT = "stepstone/function.cancelled"
INVOKE_EVENT = "stepstone/function.invoked"
SYSTEM_EVENTS = (FAILED_EVENT, FINISHED_EVENT, CANCELLED_EVENT)


class Registry:
    """Functions by id, with an index from event name to triggered functions."""

    def __init__(self) -> None:
        self.functions: dict[str, FunctionDef] = {}
        self._exact: dict[str, list[tuple[FunctionDef, Any]]] = {}
        self._wildcards: list[tuple[FunctionDef, Any]] = []
        self._ids: list[str] = []

    def add(self, fn: FunctionDef) -> None:
        """Register a user's function (and its failure handler, if any)."""
        if fn.id in self.functions:
            raise ConfigError("id", f"function id {fn.id!r} is already registered")
        self.add_definition(fn)
        if fn.on_failure is not None:
            self.add(failure_function(fn))

    def add_definition(self, fn: FunctionDef) -> None:
        """Index one definition as it is."""
        self.functions[fn.id] = fn
        self._ids = sorted(self.functions)
        for trigger in fn.event_triggers:
            if trigger.pattern is not None:
                self._wildcards.append((fn, trigger))
            else:
                self._exact.setdefault(trigger.event, []).append((fn, trigger))

    def get(self, function_id: str) -> FunctionDef | None:
        return self.functions.get(function_id)

    def starts_directly(self, function_id: str) -> bool:
        """Whether a run of the function may start in its send's transaction
        (a function of this registry whose rules allow it: ``FlowConfig.starts_directly``)."""
        fn = self.functions.get(function_id)
        return fn is not None and fn.flow.starts_directly

    def __iter__(self) -> Iterator[FunctionDef]:
        return iter(self.functions.values())

    def ids(self) -> list[str]:
        """Sorted function ids (a new list object whenever a function is added)."""
        return self._ids

    def match(self, name: str, variables: dict[str, Any]) -> list[FunctionDef]:
        """Functions triggered by an event, each at most once, in registration order."""
        found: dict[str, FunctionDef] = {}
        for fn, trigger in self._exact.get(name, ()):
            if fn.id not in found and trigger.matches(name, variables):
                found[fn.id] = fn
        for fn, trigger in self._wildcards:
            if fn.id not in found and trigger.matches(name, variables):
                found[fn.id] = fn
        return list(found.values())

    def listens_to(self, name: str) -> bool:
        return name in self._exact or any(t.pattern.fullmatch(name) for _, t in self._wildcards)


def failure_function(fn: FunctionDef) -> FunctionDef:
    """The internal function that runs ``fn.on_failure`` once per failed run."""
    assert fn.on_failure is not None
    condition = f"event.data.function_id == {_cel_string(fn.id)}"
    failure = FunctionDef(
        id=f"{fn.id}-failure",
        handler=fn.on_failure,
        triggers=(on_event(FAILED_EVENT, if_=condition),),
        retries=fn.retries,
        backoff=fn.backoff,
        flow=FlowConfig(),
        middleware=fn.middleware,
        options={"on_failure_of": fn.id},
    )
    failure.failure_of = fn.id
    return failure


def _cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
