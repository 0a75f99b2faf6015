"""``stepstone.contrib.sqlalchemy``: an ORM session on a ``step.transaction``'s
connection, on both stores; its writes commit with the step or not at all."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import stepstone as ss

from ..conftest import FAST, send_and_wait
from ..usertables import create_table, rows

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column  # noqa: E402

from stepstone.contrib.sqlalchemy import transaction_session  # noqa: E402


def model(db_url: str) -> type[Any]:
    class Base(DeclarativeBase):
        pass

    class Subscription(Base):
        __tablename__ = "subscriptions"
        __table_args__ = {} if db_url.startswith("sqlite:") else {"schema": "shop"}
        user_id: Mapped[str] = mapped_column(primary_key=True)
        attempt: Mapped[int]

    return Subscription


def test_a_session_writes_with_the_step_and_rolls_back_with_a_failed_attempt(
    make_app: Callable[..., ss.App], db_url: str
) -> None:
    create_table(db_url)
    subscription = model(db_url)
    app = make_app()
    attempts: list[int] = []

    def create(conn: Any, user_id: str) -> dict[str, Any]:
        attempts.append(len(attempts))
        with transaction_session(conn) as session:
            session.add(subscription(user_id=user_id, attempt=len(attempts) - 1))
            session.flush()
            found = session.get(subscription, user_id)  # read back through the ORM
            assert found is not None
            if len(attempts) == 1:
                raise RuntimeError("first attempt broke after its flush")
            return {"user": found.user_id, "attempt": found.attempt}

    @app.function(id="sub", trigger=ss.on_event("go"), backoff=FAST)
    def sub(ctx: ss.Context) -> Any:
        return ctx.step.transaction("create-record", create, "u1")

    app.start()
    run = send_and_wait(app, ss.Event("go"))
    assert run.status == "completed", run.error
    assert run.output == {"user": "u1", "attempt": 1}
    assert rows(db_url) == [("u1", 1)]  # the failed attempt's flushed row was rolled back


def test_a_session_outside_a_transaction_step_is_refused() -> None:
    with pytest.raises(ss.NonRetriableError), transaction_session(object()):
        pass
