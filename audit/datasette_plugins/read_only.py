"""Datasette plugin for the officers' audit UI: a read-only server answers every write with 405, never 500.

Datasette 0.65 answers a POST to a read-only canned query or a table page with an internal error (an
assertion, or a tuple where a response was expected). Nothing the officers do needs a write: every request
whose method is not GET, HEAD or OPTIONS (but the officers' login and logout) is answered here, before Datasette sees it, with
``405 Method Not Allowed`` and one line saying why. Loaded with ``datasette --plugins-dir audit/datasette_plugins``
(``make audit-ui``); not a module of the kepsilon package.
"""

from datasette import hookimpl

READ_METHODS = {"GET", "HEAD", "OPTIONS"}
# The officers' login and logout (officer_login.py) are the only forms posted: they write no data.
LOGIN_PATHS = {"/-/login", "/-/logout"}
REFUSAL = b"405: the kepsilon audit UI is read-only; writes go through the attributed `kepsilon audit` commands\n"


@hookimpl
def asgi_wrapper(datasette):
    def wrap(app):
        async def read_only(scope, receive, send):
            if (scope.get("type") == "http" and scope.get("method", "GET").upper() not in READ_METHODS
                    and scope.get("path") not in LOGIN_PATHS):
                await send({
                    "type": "http.response.start",
                    "status": 405,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"allow", b"GET, HEAD, OPTIONS")],
                })
                await send({"type": "http.response.body", "body": REFUSAL})
                return
            await app(scope, receive, send)

        return read_only

    return wrap
