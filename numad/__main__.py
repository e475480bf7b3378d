"""``python -m numad``: the ``numad`` command."""

from numad.cli.main import main

raise SystemExit(main())
