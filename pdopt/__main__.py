"""``python -m pdopt``: the same as the ``pdopt`` command."""

import sys

from pdopt.cli import main

sys.exit(main())
