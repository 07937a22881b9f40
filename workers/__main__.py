"""``python -m workers``: run one worker (see ``workers.cli``)."""

import sys

from workers.cli import main

sys.exit(main())
