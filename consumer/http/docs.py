"""`GET /docs`, the interactive API documentation, with no network: the Swagger UI page and its assets are
served by the service itself (from the `swagger-ui-bundle-v2` package), never from a CDN, so the page also
renders offline and behind a firewall.

`install_docs(app)` adds `GET /docs` (the page, pointing at `/openapi.json`) and
`GET /docs/assets/{name}` for the few files the page loads (`ASSETS`); any other name is a 404. Both answer
HEAD too and stay out of the OpenAPI document.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]  # ships no py.typed

from consumer.http.errors import ApiError

DOCS_PATH: Final = "/docs"
ASSETS_PATH: Final = "/docs/assets"
SCRIPT: Final = "swagger-ui-bundle.js"
STYLE: Final = "swagger-ui.css"
ICON: Final = "favicon-32x32.png"
ASSETS: Final = {
    SCRIPT: "text/javascript; charset=utf-8",
    STYLE: "text/css; charset=utf-8",
    ICON: "image/png",
}
"""Every file `/docs` loads, with its content type: nothing else of the bundle is served."""


def assets_dir() -> Path:
    """The folder of the installed Swagger UI files (a plain directory inside site-packages)."""
    return Path(str(swagger_ui_path))


def install_docs(app: FastAPI, openapi_url: str = "/openapi.json") -> None:
    """Add the `/docs` page and its asset route to `app` (built with `docs_url=None`). Call once, before
    serving; raises `FileNotFoundError` at once if the installed bundle lacks a file the page needs."""
    folder = assets_dir()
    for name in ASSETS:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"Swagger UI asset {name!r} missing in {folder}")
    title = f"{app.title} - docs"

    async def docs_page() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=title,
            swagger_js_url=f"{ASSETS_PATH}/{SCRIPT}",
            swagger_css_url=f"{ASSETS_PATH}/{STYLE}",
            swagger_favicon_url=f"{ASSETS_PATH}/{ICON}",
        )

    async def docs_asset(name: str) -> FileResponse:
        media_type = ASSETS.get(name)
        if media_type is None:  # only the listed names: no path from the request reaches the file system
            raise ApiError(404, "not_found", f"no documentation asset {name!r}")
        return FileResponse(folder / name, media_type=media_type, headers={"Cache-Control": "max-age=86400"})

    app.add_api_route(DOCS_PATH, docs_page, methods=["GET", "HEAD"], include_in_schema=False)
    app.add_api_route(f"{ASSETS_PATH}/{{name}}", docs_asset, methods=["GET", "HEAD"], include_in_schema=False)
