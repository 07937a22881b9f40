"""``python -m router``: see ``router.cli``."""

import sys

from router.cli import main

sys.exit(main())
