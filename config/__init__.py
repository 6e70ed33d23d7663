"""cronoq.config."""
