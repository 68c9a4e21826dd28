"""`python -m bench.service_main ARGS...`: `clef-router ARGS...` for the start-up benches' child process.

Where PyAV cannot be imported (the H200 machine has none), it first registers the placeholder
(`bench.av_placeholder`), so the engine imports; the benches send no media.
"""

from __future__ import annotations

import sys

from bench.av_placeholder import install_av_placeholder

if __name__ == "__main__":
    install_av_placeholder()
    from consumer.cli import main

    sys.exit(main(sys.argv[1:]))
