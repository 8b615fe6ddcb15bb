"""``python -m soma.runs --journal PATH [list | show ID | prune --older-than 30d]``."""

import sys

from soma.runs._command import main

sys.exit(main(sys.argv[1:]))
