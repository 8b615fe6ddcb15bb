"""``python -m soma.view [--port N] [--host H]``: serves the view until Ctrl-C. Alone in its
process it shows that process's runs — none, until the durable-runs issue brings journals of
runs recorded by other processes; meanwhile it is the page's server for trying it."""

from __future__ import annotations

import argparse
import threading

from soma.view import view


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m soma.view", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="0 takes a free port (the default)")
    parser.add_argument("--host", default="127.0.0.1", help="127.0.0.1 unless told otherwise")
    arguments = parser.parse_args(argv)
    served = view(port=arguments.port, host=arguments.host)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        served.close()


if __name__ == "__main__":
    main()
