"""``python -m cronoq.cli``: the same as the ``cronoq`` console script."""

from cronoq.cli import main

raise SystemExit(main())
