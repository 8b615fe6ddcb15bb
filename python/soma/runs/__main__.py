"""``python -m soma.runs --journal PATH [list | show ID | prune --older-than 30d]``."""

import sys

from soma.runs._command import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
