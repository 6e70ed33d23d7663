"""cronoq: an elastic, priority-aware task scheduler."""
