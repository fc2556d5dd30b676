"""The console's icon (/favicon.svg, linked from every page, and
/favicon.ico, which browsers ask for on their own): a small SVG served
without a login, so that no page's request answers 404."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from rota.dashboard.web import Console

ICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
    '<rect width="32" height="32" rx="7" fill="#2b5fd9"/>'
    '<path d="M8 24V8h9a5 5 0 0 1 0 10h-9m8 0l7 6" fill="none" stroke="#fff" '
    'stroke-width="3" stroke-linecap="round" stroke-linejoin="round"/></svg>'
)


async def icon(request: Request, console: Console) -> Response:
    return Response(
        ICON,
        media_type="image/svg+xml",
        headers={"cache-control": "public, max-age=86400"},
    )
