"""The domain's words: SQL literals and the enums they mirror."""

from __future__ import annotations

import dataclasses
import re
from importlib import resources

from stepstone.store.rows import RunRow, RunStatus, StepKind, StepRow, StepStatus, WaitKind
from stepstone.store.viewrows import JobStatus


def test_every_word_queries_sql_spells_is_an_enum_member() -> None:
    text = resources.files("stepstone.store").joinpath("queries.sql").read_text()
    code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    words = set(re.findall(r"'([^']*)'", code)) - {""}
    members = {str(m) for enum in (RunStatus, StepStatus, StepKind, WaitKind, JobStatus) for m in enum}
    assert words, "no literal found: the pattern is out of date"
    assert words <= members, sorted(words - members)


def test_rows_read_back_have_every_field_as_their_constructor_sets_it() -> None:
    """``from_row`` builds a run's and a step's row without the dataclass's
    ``__init__`` (``rows.filled``): each must still give every field, so the
    row equals the one the constructor makes."""
    columns = {
        "id": "r",
        "function_id": "f",
        "status": "completed",
        "event_ids": '["e"]',
        "output": "1",
        "error": None,
        "created_at": 1.0,
        "started_at": 2.0,
        "ended_at": 3.0,
        "attempt": 1,
        "app_version": "v",
        "parent_run_id": None,
        "parent_step_id": None,
        "meta": None,
        "singleton_key": "k",
        "run_id": "r",
        "step_id": "s",
        "position": 0,
        "kind": "run",
        "attempts": 1,
        "wake_at": None,
        "fingerprint": "fp",
    }
    for cls in (RunRow, StepRow):
        row = cls.from_row(columns)
        names = {f.name for f in dataclasses.fields(cls)}
        assert set(vars(row)) == names
        assert row == cls(**vars(row))
        assert isinstance(row.status, RunStatus if cls is RunRow else StepStatus)
