"""``python -m logsdk.testing.chaos``: see `logsdk.testing.chaos._main`."""

import sys

from logsdk.testing.chaos._main import main

if __name__ == "__main__":
    sys.exit(main())
