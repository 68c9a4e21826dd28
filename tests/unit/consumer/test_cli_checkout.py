"""`consumer.commands.checkout.require_dev_package`: a dev command finds the dev packages of the checkout its
product was installed from (editable), and says it needs a checkout when the product came from a wheel."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import consumer
from consumer.commands import CommandError
from consumer.commands.checkout import require_dev_package

PACKAGE = "clef_devpkg_probe"  # a name no installed package has


def _tree(root: Path, *, pyproject: bool, package: bool) -> None:
    (root / "consumer").mkdir(parents=True)
    (root / "consumer" / "__init__.py").write_text("")
    if pyproject:
        (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    if package:
        (root / PACKAGE).mkdir()
        (root / PACKAGE / "__init__.py").write_text("MARK = 'from the checkout'\n")


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sys.path` and the probe package restored after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, PACKAGE, raising=False)


@pytest.mark.usefixtures("isolated")
def test_a_checkout_beside_the_installed_product_is_appended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path, pyproject=True, package=True)
    monkeypatch.setattr(consumer, "__file__", str(tmp_path / "consumer" / "__init__.py"))
    before = list(sys.path)
    require_dev_package(PACKAGE, "clef-router probe")
    assert sys.path == [*before, str(tmp_path.resolve())]  # last: shadows no installed package
    assert importlib.import_module(PACKAGE).MARK == "from the checkout"
    require_dev_package(PACKAGE, "clef-router probe")  # importable now: nothing more is added
    assert len(sys.path) == len(before) + 1


@pytest.mark.usefixtures("isolated")
@pytest.mark.parametrize(("pyproject", "package"), [(False, True), (True, False)])
def test_without_a_checkout_the_command_says_it_needs_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pyproject: bool, package: bool
) -> None:
    _tree(tmp_path, pyproject=pyproject, package=package)
    monkeypatch.setattr(consumer, "__file__", str(tmp_path / "consumer" / "__init__.py"))
    before = list(sys.path)
    with pytest.raises(CommandError, match=r"clef-router probe is a dev command: .*checkout"):
        require_dev_package(PACKAGE, "clef-router probe")
    assert sys.path == before


@pytest.mark.usefixtures("isolated")
def test_an_importable_package_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path, pyproject=False, package=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(consumer, "__file__", str(tmp_path / "nowhere" / "consumer" / "__init__.py"))
    before = list(sys.path)
    require_dev_package(PACKAGE, "clef-router probe")
    assert sys.path == before
