"""Bench tool (not product): a folder of links to exactly the installed distributions clef-router depends on.

The GPU machine's image carries hundreds of packages the product never installs (scikit-learn, torchvision,
accelerate, ...), and transformers imports some of them whenever they are present: scikit-learn alone adds
about 2 s to importing the thinker's class there. `python -m bench.closure_site DIR` links into DIR every
top-level package and `.dist-info` folder of the dependency closure of `pyproject.toml`'s
`[project.dependencies]` (markers evaluated for this interpreter, no extras unless a requirement names them),
as the product image would hold them; `python -S` with `PYTHONPATH=DIR` then sees nothing else. Prints one
JSON line: linked distributions, the required ones that are not installed, and what was left out of reach.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]


def closure(requirements: list[str]) -> tuple[dict[str, metadata.Distribution], list[str]]:
    """Installed distribution by canonical name for the whole closure of `requirements`, and the
    required names that are not installed."""
    found: dict[str, metadata.Distribution] = {}
    missing: list[str] = []
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in found or name in missing:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        found[name] = dist
        for line in dist.requires or []:
            sub = Requirement(line)
            for wanted in ("", *sorted(req.extras)):
                if sub.marker is None or sub.marker.evaluate({"extra": wanted}):
                    todo.append((sub, wanted))
                    break
    return found, sorted(missing)


def top_level(dist: metadata.Distribution) -> set[str]:
    """The entries of site-packages a distribution installed (packages, modules, its .dist-info)."""
    entries = set()
    for file in dist.files or []:
        first = Path(str(file)).parts[0]
        if first not in ("..", "__pycache__") and not first.endswith(".pth"):
            entries.add(first)
    if not entries:
        entries.update((dist.read_text("top_level.txt") or "").split())
    return entries


def link(target: Path, dists: dict[str, metadata.Distribution]) -> list[str]:
    """Link every dist's top-level entries into `target`; returns the entries that could not be found."""
    target.mkdir(parents=True, exist_ok=True)
    absent: list[str] = []
    for dist in dists.values():
        for entry in sorted(top_level(dist)):
            source = Path(str(dist.locate_file(entry)))
            if not source.exists():
                if not entry.endswith(".py"):  # a package may list a module it installs as a folder
                    absent.append(f"{dist.metadata['Name']}:{entry}")
                continue
            link_path = target / entry
            if not link_path.exists():
                link_path.symlink_to(source)
    return absent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.closure_site", description=__doc__.split("\n\n")[0])
    p.add_argument("target", type=Path, help="folder to create (links only)")
    args = p.parse_args(argv)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dists, missing = closure(list(project["dependencies"]))
    absent = link(args.target, dists)
    record = {
        "what": "closure_site",
        "target": str(args.target),
        "linked": sorted(f"{d.metadata['Name']}=={d.version}" for d in dists.values()),
        "not_installed": missing,
        "absent_entries": absent[:20],
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
