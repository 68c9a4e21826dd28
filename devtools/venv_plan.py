"""What `scripts/setup.sh` may do to a virtualenv of the user's own (`CLEF_VENV`): install what is missing,
link this clone, and never change a package that is already there.

Run by setup.sh with any Python 3 (standard library only, so it works before the venv has anything):

    python3 devtools/venv_plan.py constraints INSTALLED.json constraints.txt   > filtered-constraints.txt
    python3 devtools/venv_plan.py plan INSTALLED.json REPORT.json PROJECT       > to-install.txt

`INSTALLED.json` maps each distribution the venv sees to its version (names as given; compared
canonicalised). `constraints` prints the pins of `constraints.txt` without those of installed packages: a
pin applies only to what gets installed, and an installed package keeps its version. `plan` reads pip's
installation report (`pip install --dry-run --report`) and prints, one a line, the exact `name==version`
of every missing distribution to install (never `PROJECT`, which setup.sh links itself); on stderr it says
what it installs and why (which requirement asked for it). When the report would change an installed
distribution (upgrade or downgrade), it prints nothing on stdout, says on stderr what would change and
which requirement wants it, and exits 3: setup.sh then installs nothing.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REFUSED = 3
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """A distribution name in PEP 503 normal form (`Typing_Extensions` -> `typing-extensions`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str | None:
    """The canonical distribution name a requirement string starts with (`"torch>=2.11; ..."` -> `torch`)."""
    found = _NAME.match(requirement)
    return canonical(found.group(1)) if found else None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0]))


@dataclass(frozen=True, slots=True)
class Plan:
    """`install`: `name==version` lines for missing distributions; `notes`: what and why, for a person;
    `changes`: one line per installed distribution the report would change (empty: nothing is changed)."""

    install: tuple[str, ...]
    notes: tuple[str, ...]
    changes: tuple[str, ...]


def filter_constraints(lines: Sequence[str], installed: Mapping[str, str]) -> list[str]:
    """`lines` of a constraints file without the pins of installed distributions (comments dropped too)."""
    have = {canonical(name) for name in installed}
    kept = []
    for line in lines:
        text = line.split("#", 1)[0].strip()
        name = requirement_name(text) if text else None
        if name is not None and name not in have:
            kept.append(text)
    return kept


def _why(name: str, items: Sequence[Mapping[str, Any]]) -> str:
    wanted = [
        f"{item['metadata']['name']} requires {requirement!r}"
        for item in items
        for requirement in item["metadata"].get("requires_dist") or []
        if requirement_name(requirement) == name
    ]
    return "; ".join(wanted) if wanted else "needed by an installed package"


def make_plan(installed: Mapping[str, str], report: Mapping[str, Any], project: str) -> Plan:
    """The plan for pip's `report` against what is `installed` (see the module docstring). Pure."""
    have = {canonical(name): version for name, version in installed.items()}
    items = list(report.get("install", []))
    install: list[str] = []
    notes: list[str] = []
    changes: list[str] = []
    for item in items:
        meta = item["metadata"]
        name, version = canonical(meta["name"]), str(meta["version"])
        if name == canonical(project):
            continue
        if name not in have:
            install.append(f"{meta['name']}=={version}")
            notes.append(f"install {meta['name']} {version}: missing ({_why(name, items)})")
            continue
        old = have[name]
        verb = "downgrade" if _version_key(version) < _version_key(old) else "upgrade"
        if _version_key(version) == _version_key(old):
            verb = "reinstall"
        changes.append(f"would {verb} {meta['name']} {old} -> {version}: {_why(name, items)}")
    return Plan(tuple(install), tuple(notes), tuple(changes))


def _installed(path: str) -> dict[str, str]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return {str(name): str(version) for name, version in data.items()}


def main(argv: Sequence[str]) -> int:
    """The command line above; 0 on success, `REFUSED` when installed packages would change, 2 on misuse."""
    if len(argv) == 3 and argv[0] == "constraints":
        lines = Path(argv[2]).read_text(encoding="utf-8").splitlines()
        for line in filter_constraints(lines, _installed(argv[1])):
            print(line)
        return 0
    if len(argv) == 4 and argv[0] == "plan":
        report = json.loads(Path(argv[2]).read_text(encoding="utf-8"))
        plan = make_plan(_installed(argv[1]), report, argv[3])
        if plan.changes:
            for line in plan.changes:
                print(f"  {line}", file=sys.stderr)
            return REFUSED
        for line in plan.notes:
            print(f"  {line}", file=sys.stderr)
        for line in plan.install:
            print(line)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
