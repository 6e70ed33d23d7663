"""cronoq.engine."""
