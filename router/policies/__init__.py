"""Routing decisions: pure functions over the registry's view of the workers. No I/O here."""
