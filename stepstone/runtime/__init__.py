"""Inside one transaction: events in, runs admitted, runs ended."""
