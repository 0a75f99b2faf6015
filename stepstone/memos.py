"""Whether a recorded memo belongs to the step call that reached its id.

Steps are matched by id, and a repeated id (``fetch``, ``fetch:1``, ...) by
call order: a deploy that adds one more call of it shifts every suffix, and
each call would be handed the value its neighbour recorded. So every memo
records its kind and what it called (its fingerprint: the function a
``step.run`` called, the event a wait waited for, the function invoked); a
call of another kind, or of another function, never gets the memo. The
interpreter then fails the run with ``NondeterminismError`` instead: no value
is returned and nothing after it executes. A fix inside a step's function
keeps its name, so replaying after a bug fix is unaffected.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from stepstone.store.rows import StepRow


def callable_fingerprint(fn: Callable[..., Any]) -> str:
    """A name for what a ``step.run`` calls that survives a redeploy of the same
    code: the function's qualified name (a lambda's also lists the names it
    uses, so ``lambda: get_plan(u)`` and ``lambda: get_user(u)`` differ)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    target = getattr(fn, "__func__", fn)  # bound methods
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    code = getattr(target, "__code__", None)
    if name.endswith("<lambda>") and code is not None:
        return f"{name}({','.join(code.co_names)})"
    return str(name)


def mismatch(memo: StepRow, kind: str, fingerprint: str | None) -> str | None:
    """Why ``memo`` must not be returned to a call of ``kind``/``fingerprint``
    (``None``: it may). Memos recorded before fingerprints existed match."""
    if memo.kind != kind:
        return (
            f"step {memo.step_id!r} was recorded as a {memo.kind} step; this code reaches it as a {kind} step"
        )
    if memo.fingerprint and fingerprint and memo.fingerprint != fingerprint:
        return (
            f"step {memo.step_id!r} was recorded calling {memo.fingerprint}; this code "
            f"calls {fingerprint} there (a call with this id was added, removed or moved "
            "before it, or the function was renamed)"
        )
    return None
