"""``python -m numad``: the ``numad`` command."""

from numad.cli import main

raise SystemExit(main())
