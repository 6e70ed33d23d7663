"""cronoq.cluster."""
