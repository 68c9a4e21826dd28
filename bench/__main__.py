"""`python -m bench COMMAND ...` (see `bench.cli`)."""

from bench.cli import main

raise SystemExit(main())
