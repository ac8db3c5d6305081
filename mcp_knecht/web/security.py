"""The headers every web response carries, and the static files under them.

The policy allows scripts, styles, images and connections from our own origin only: no inline
script or style anywhere (templates carry none; scripts read their settings from `data-` attributes),
no eval, no framing, forms post only to us. Pages are never cached (they show who is signed in and
what they may do). `Referrer-Policy: same-origin` keeps a sign-in link's secret out of other sites'
logs (`no-referrer` would make browsers send `Origin: null` on our own form posts).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, Response
from starlette.routing import Route

CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
    "base-uri 'none'",
])
HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
}
HSTS = "max-age=31536000"


def secure_headers(response: Response, *, tls: bool, cache: str = "no-store") -> Response:
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    response.headers.setdefault("Cache-Control", cache)
    if tls:
        response.headers.setdefault("Strict-Transport-Security", HSTS)
    return response


def static_route(directory: Path) -> Route:
    """`/static/NAME`: exactly the files shipped in `directory` (our stylesheet and scripts), with the
    same headers as the pages, cached for an hour."""
    files = {entry.name: entry for entry in directory.iterdir() if entry.is_file()}

    async def static_file(request: Request) -> Response:
        found = files.get(request.path_params["name"])
        if found is None:
            return secure_headers(PlainTextResponse("Not found.", status_code=404), tls=False)
        return secure_headers(FileResponse(found), tls=request.url.scheme == "https", cache="public, max-age=3600")

    return Route("/static/{name}", static_file, methods=["GET", "HEAD"])
