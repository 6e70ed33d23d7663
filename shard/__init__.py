"""cronoq.shard."""
