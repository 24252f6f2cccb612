"""``python -m optuna_memprune.cli``: the ``memprune`` command."""

import sys

from . import main

sys.exit(main())
