"""``python -m soma.view [--journal PATH] [--port N] [--host H]``: serves the view until
Ctrl-C. With a journal it lists every run recorded there, by any process, and answers paused
ones; alone in its process it shows that process's runs (none) and serves the page."""

from __future__ import annotations

import argparse
import threading

from soma.journal import Journal
from soma.view import view


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m soma.view", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="0 takes a free port (the default)")
    parser.add_argument("--host", default="127.0.0.1", help="127.0.0.1 unless told otherwise")
    parser.add_argument("--journal", help="a journal's file or URL: its runs are listed too")
    arguments = parser.parse_args(argv)
    journal = None if arguments.journal is None else Journal(arguments.journal)
    served = view(port=arguments.port, host=arguments.host, journal=journal)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        served.close()
        if journal is not None:
            journal.close()


if __name__ == "__main__":
    main()
