"""cronoq.stores."""
