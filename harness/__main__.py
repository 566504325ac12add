"""``python -m kvspec.harness`` is ``kvspec``."""

import sys

from kvspec.harness.cli import main

sys.exit(main())
