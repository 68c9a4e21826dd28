"""bench.closure_site: the product's dependency closure as a folder of links."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.closure_site import closure, link, main


def test_closure_follows_requirements_and_markers() -> None:
    dists, missing = closure(["pydantic>=2", "tenacity; python_version < '3'", "no-such-dist-clef"])
    assert {"pydantic", "pydantic-core", "annotated-types", "typing-extensions"} <= set(dists)
    assert "tenacity" not in dists  # its marker is false here
    assert missing == ["no-such-dist-clef"]


def test_linked_folder_imports_its_packages_and_nothing_else(tmp_path: Path) -> None:
    dists, _ = closure(["structlog"])
    assert link(tmp_path / "site", dists) == []
    assert (tmp_path / "site" / "structlog").is_symlink()
    code = "import importlib.util as u, structlog; print(u.find_spec('pytest') is None)"
    out = subprocess.run(
        [sys.executable, "-S", "-c", code],
        env={"PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "True"


def test_main_links_the_project_closure(tmp_path: Path) -> None:
    assert main([str(tmp_path / "all")]) == 0
    assert (tmp_path / "all" / "torch").is_symlink()
    assert (tmp_path / "all" / "transformers").is_symlink()
