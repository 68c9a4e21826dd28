"""`python -m bench.service_main ARGS...`: `clef-router ARGS...` for the start-up benches' child process.

Where PyAV cannot be imported (the H200 machine has none), it first registers `bench.e2e`'s placeholder,
so the engine imports; the benches send no media.
"""

from __future__ import annotations

import sys

from bench.e2e import install_av_placeholder

if __name__ == "__main__":
    install_av_placeholder()
    from consumer.cli import main

    sys.exit(main(sys.argv[1:]))
