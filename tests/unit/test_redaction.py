"""The worker's start-up line names its database without the password."""

from __future__ import annotations

from stepstone.cli.common import redacted as _redacted


def test_database_url_passwords_are_not_logged() -> None:
    assert _redacted("postgresql://app:s3cr3t@db:5432/prod?sslmode=require") == (
        "postgresql://app:***@db:5432/prod?sslmode=require"
    )
    assert _redacted("postgresql://app@db/prod") == "postgresql://app@db/prod"
    assert _redacted("sqlite:///.stepstone/stepstone.db") == "sqlite:///.stepstone/stepstone.db"
