"""``python -m kvspec.harness`` is ``kvspec`` (a Ctrl-C while it starts up: exit 130, no traceback)."""

import sys

try:
    from kvspec.harness.cli import main
except KeyboardInterrupt:
    sys.exit(130)

sys.exit(main())
