"""Group commit: run several operations in one transaction, each isolated by a
savepoint so that one failing operation is rolled back alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

OpResult = tuple[bool, Any]  # (ok, value or exception)


def run_batch(
    conn: Any,
    ops: Sequence[Callable[[Any], Any]],
    make_tx: Callable[[Any], Any],
    begin: str,
    translate: Callable[[BaseException], BaseException],
    before_commit: Callable[[Any], Any] | None = None,
) -> list[OpResult]:
    """Run ``ops`` in one transaction on ``conn``; returns one outcome per op.

    ``before_commit(tx)``, if given, runs last inside the transaction (the
    PostgreSQL store issues its NOTIFY there). If the transaction itself fails
    (begin, ``before_commit`` or commit), every op gets the translated error:
    none of them took effect.
    """
    tx = make_tx(conn)
    try:
        conn.execute(begin)
    except Exception as exc:  # noqa: BLE001 - translated and handed to every caller
        err = translate(exc)
        return [(False, err)] * len(ops)
    outcomes: list[OpResult] = []
    try:
        if len(ops) == 1:
            try:
                outcomes.append((True, ops[0](tx)))
            except Exception as exc:  # noqa: BLE001 - the op's own failure
                conn.execute("ROLLBACK")
                return [(False, translate(exc))]
        else:
            for op in ops:
                conn.execute("SAVEPOINT op")
                try:
                    value = op(tx)
                    # An op may return although a statement of its failed (PostgreSQL
                    # then refuses the release): it failed, and it gets one outcome.
                    conn.execute("RELEASE SAVEPOINT op")
                    outcomes.append((True, value))
                except Exception as exc:  # noqa: BLE001 - the op's own failure
                    conn.execute("ROLLBACK TO SAVEPOINT op")
                    conn.execute("RELEASE SAVEPOINT op")
                    outcomes.append((False, translate(exc)))
        if before_commit is not None:
            before_commit(tx)
        conn.execute("COMMIT")
    except Exception as exc:  # noqa: BLE001 - commit failed: nothing took effect
        try:
            conn.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - the connection may be gone
            pass
        err = translate(exc)
        return [(False, err)] * len(ops)
    return outcomes
