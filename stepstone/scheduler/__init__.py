"""Scheduling: cron ticks, flow control and fair partition selection."""
