"""The implementation of ``cronoq.client`` (the public names are re-exported there)."""
