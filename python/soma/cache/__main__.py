"""``python -m soma.cache PATH``: runs the command of :mod:`soma.cache`."""

import sys

from soma.cache import main

if __name__ == "__main__":
    sys.exit(main())
