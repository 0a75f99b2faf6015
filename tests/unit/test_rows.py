"""The domain's words: SQL literals and the enums they mirror."""

from __future__ import annotations

import re
from importlib import resources

from stepstone.store.rows import RunStatus, StepKind, StepStatus, WaitKind
from stepstone.store.viewrows import JobStatus


def test_every_word_queries_sql_spells_is_an_enum_member() -> None:
    text = resources.files("stepstone.store").joinpath("queries.sql").read_text()
    code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    words = set(re.findall(r"'([^']*)'", code)) - {""}
    members = {str(m) for enum in (RunStatus, StepStatus, StepKind, WaitKind, JobStatus) for m in enum}
    assert words, "no literal found: the pattern is out of date"
    assert words <= members, sorted(words - members)
