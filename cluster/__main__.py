"""``python -m cronoq.cluster up | status | down`` (the same as ``cronoq cluster ...``)."""

from __future__ import annotations

import sys

from .launcher import main

sys.exit(main(sys.argv[1:]))
