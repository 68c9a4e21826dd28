"""Dev commands' access to the dev packages of a checkout (`devtools`, `bench`), which the product wheel
does not ship.

An editable install (`pip install -e .`, as `scripts/setup.sh` does) maps only the product's packages, and
the `clef-router` console script does not put the current directory on `sys.path`, so from a checkout the
dev packages are found through the installed product: its `consumer` package sits in the checkout.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import consumer
from consumer.commands import CommandError


def require_dev_package(package: str, command: str) -> None:
    """Make the top-level dev package `package` importable for the dev command `command`, or raise.

    Called by a dev command's handler before it imports from `package`; blocking (a few file checks).
    Nothing changes when `package` already imports (`python -m` from a checkout, `PYTHONPATH`, an image
    that installs it). Otherwise, when `consumer` was imported from a checkout (`pyproject.toml` and
    `<package>/__init__.py` beside `consumer/`), that checkout's root is appended to `sys.path`: after the
    installed packages, so it adds the dev package and shadows none. Raises `CommandError` when neither
    holds (the product installed from its wheel): the command needs a checkout.
    """
    if importlib.util.find_spec(package) is not None:
        return
    if consumer.__file__ is not None:
        root = Path(consumer.__file__).resolve().parent.parent
        if (root / "pyproject.toml").is_file() and (root / package / "__init__.py").is_file():
            sys.path.append(str(root))
            importlib.invalidate_caches()
            return
    raise CommandError(
        f"{command} is a dev command: it needs the {package!r} package of a clef-router checkout, which the "
        "installed product does not ship; run it from a clone installed with scripts/setup.sh"
    )
