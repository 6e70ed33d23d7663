"""cronoq.router."""
