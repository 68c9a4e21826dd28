"""devtools.venv_plan: what setup.sh may do to a user's own CLEF_VENV (install what is missing, change
nothing that is there)."""

from __future__ import annotations

from typing import Any

from devtools.venv_plan import REFUSED, filter_constraints, main, make_plan


def _item(name: str, version: str, requires: list[str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "version": version, "requires_dist": requires or []}}


PROJECT = _item(
    "clef-router", "0.1.0", ["torch>=2.11", "swagger-ui-bundle-v2<6,>=5.31", 'pytest>=8; extra == "dev"']
)


def test_pins_apply_only_to_what_is_missing() -> None:
    lines = ["# pins", "torch==2.11.0", "transformers==5.17.0  # ours", "", "Swagger_UI_Bundle_v2==5.31.0"]
    assert filter_constraints(lines, {"torch": "2.15.0", "swagger-ui-bundle-v2": "5.31.0"}) == [
        "transformers==5.17.0"
    ]


def test_missing_packages_are_installed_with_the_reason() -> None:
    report = {"install": [PROJECT, _item("swagger-ui-bundle-v2", "5.31.0", ["Jinja2<4,>=3"])]}
    plan = make_plan({"torch": "2.15.0", "Jinja2": "3.1.6"}, report, "clef-router")
    assert plan.install == ("swagger-ui-bundle-v2==5.31.0",)
    assert plan.changes == ()
    assert plan.notes == (
        "install swagger-ui-bundle-v2 5.31.0: missing (clef-router requires 'swagger-ui-bundle-v2<6,>=5.31')",
    )


def test_a_change_to_an_installed_package_is_refused_and_explained() -> None:
    report = {"install": [PROJECT, _item("torch", "2.11.0")]}
    plan = make_plan({"torch": "2.15.0"}, report, "clef-router")
    assert plan.install == ()
    assert plan.changes == ("would downgrade torch 2.15.0 -> 2.11.0: clef-router requires 'torch>=2.11'",)
    upgrade = make_plan({"Torch": "2.9.1"}, report, "clef-router")
    assert upgrade.changes[0].startswith("would upgrade torch 2.9.1 -> 2.11.0")


def test_command_line_exits_refused_and_prints_nothing_to_install(tmp_path: Any, capsys: Any) -> None:
    installed, report = tmp_path / "installed.json", tmp_path / "report.json"
    installed.write_text('{"torch": "2.15.0"}')
    report.write_text('{"install": [{"metadata": {"name": "torch", "version": "2.11.0"}}]}')
    assert main(["plan", str(installed), str(report), "clef-router"]) == REFUSED
    out = capsys.readouterr()
    assert out.out == ""
    assert "would downgrade torch 2.15.0 -> 2.11.0" in out.err
    assert main(["nonsense"]) == 2
