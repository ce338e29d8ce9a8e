"""Datasette plugin for the officers' audit UI: nothing is answered to a visitor who has not logged in.

Every request passes a gate (an ASGI wrapper, outside Datasette's own routing, so no page, table, JSON or CSV
endpoint, canned query, ``/-/`` introspection page or database download is missed) that lets through only:

- a request carrying Datasette's signed ``ds_actor`` cookie, unexpired, for a name that is still an
  officer in the accounts file (``kepsilon.audit.officers``, reread on each request: a removed officer is
  refused at once);
- the login form ``/-/login`` (GET shows it, POST checks the name and password against the scrypt hashes),
  Datasette's own ``/-/logout`` and its static assets (its CSS, the same for every installation).

Any other request is refused: ``302`` to the login form for a page a browser asks for, ``401`` for JSON and
CSV or any method but GET and HEAD. A wrong password is answered after a one-second pause. The cookie is
signed with Datasette's secret (``DATASETTE_SECRET``, random per start when unset: a restart logs everyone
out) and expires after ``SESSION_SECONDS``. Loaded with ``--plugins-dir audit/datasette_plugins``.
"""

import asyncio
import html
import time
import urllib.parse

from datasette import hookimpl
from datasette.utils import baseconv
from datasette.utils.asgi import Response
from itsdangerous import BadSignature

from kepsilon.audit import officers

SESSION_SECONDS = 8 * 3600
LOGIN_PATH = "/-/login"
LOGOUT_PATH = "/-/logout"
OPEN_PREFIXES = ("/-/static/",)
FAILED_LOGIN_PAUSE = 1.0


def signed_in(datasette, scope) -> str | None:
    """The officer a request's ``ds_actor`` cookie names, if signed by this server, unexpired, and still an account."""
    cookies = {}
    for key, value in scope.get("headers", []):
        if key == b"cookie":
            for part in value.decode("latin-1").split(";"):
                name, _, content = part.strip().partition("=")
                cookies[name] = content
    if "ds_actor" not in cookies:
        return None
    try:
        decoded = datasette.unsign(cookies["ds_actor"], "actor")
    except BadSignature:
        return None
    if not isinstance(decoded, dict) or not isinstance(decoded.get("a"), dict):
        return None
    expires = decoded.get("e")
    if not expires or time.time() > baseconv.base62.decode(expires):
        return None  # every cookie this plugin signs has an expiry: one without was not made here
    name = decoded["a"].get("id")
    if not isinstance(name, str) or name not in officers.load_accounts():
        return None
    return name


def _is_open(path: str, method: str) -> bool:
    return path in (LOGIN_PATH, LOGOUT_PATH) or (method in ("GET", "HEAD") and path.startswith(OPEN_PREFIXES))


async def _refuse(scope, send) -> None:
    path = scope.get("path", "")
    method = scope.get("method", "GET").upper()
    wants_data = path.endswith((".json", ".csv")) or "_format=" in scope.get("query_string", b"").decode("latin-1")
    if method in ("GET", "HEAD") and not wants_data:
        target = path + ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
        location = LOGIN_PATH + "?" + urllib.parse.urlencode({"next": target})
        await send({"type": "http.response.start", "status": 302,
                    "headers": [(b"location", location.encode()), (b"content-type", b"text/plain; charset=utf-8")]})
        await send({"type": "http.response.body", "body": b"302: log in first\n"})
        return
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
    await send({"type": "http.response.body", "body": b"401: the kepsilon audit UI needs an officer's login (/-/login)\n"})


@hookimpl
def asgi_wrapper(datasette):
    def wrap(app):
        async def gate(scope, receive, send):
            if scope.get("type") != "http":
                await app(scope, receive, send)
                return
            if _is_open(scope.get("path", ""), scope.get("method", "GET").upper()) or signed_in(datasette, scope):
                await app(scope, receive, send)
                return
            await _refuse(scope, send)

        return gate

    return wrap


def _safe_next(target: str | None) -> str:
    """Only a path on this server (no scheme, no host, no ``//``): the login never redirects elsewhere."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _form(request, message: str = "", next_path: str = "/") -> str:
    token = html.escape(request.scope["csrftoken"]())
    note = f'<p class="message-error">{html.escape(message)}</p>' if message else ""
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Log in: kepsilon audit store</title>
<link rel="stylesheet" href="/-/static/app.css"></head>
<body><section class="content"><h1>kepsilon audit store: officers' login</h1>{note}
<form action="{LOGIN_PATH}" method="post">
<input type="hidden" name="csrftoken" value="{token}">
<input type="hidden" name="next" value="{html.escape(next_path)}">
<p><label for="officer">Officer</label> <input id="officer" name="username" autocomplete="username" required></p>
<p><label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required></p>
<p><input type="submit" value="Log in"></p>
</form></section></body></html>"""


async def login(datasette, request):
    if request.method != "POST":
        return Response.html(_form(request, next_path=_safe_next(request.args.get("next"))))
    form = await request.post_vars()
    name, password = form.get("username", ""), form.get("password", "")
    next_path = _safe_next(form.get("next"))
    if not officers.check(name, password):
        await asyncio.sleep(FAILED_LOGIN_PAUSE)
        return Response.html(_form(request, "Wrong officer name or password.", next_path), status=401)
    response = Response.redirect(next_path)
    expires = baseconv.base62.encode(int(time.time()) + SESSION_SECONDS)
    response.set_cookie("ds_actor", datasette.sign({"a": {"id": name}, "e": expires}, "actor"), httponly=True,
                        samesite="lax", max_age=SESSION_SECONDS)
    return response


@hookimpl
def register_routes():
    return [(r"^/-/login$", login)]
