-- PostgreSQL dialect of sqlite/0004_tracing.sql (same statements, PostgreSQL types).
-- The W3C trace context of the code that sent an event (OpenTelemetry), so the
-- runs it starts are traced under it.
ALTER TABLE events ADD COLUMN trace TEXT;
