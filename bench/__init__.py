"""Benchmarks of clef-router, run from a checkout: `python -m bench COMMAND` (`bench.cli`) or one module as
`python -m bench.<name>`. Not part of the product wheel; the product imports nothing from here."""
