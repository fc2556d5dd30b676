"""The operations dashboard (`rota dashboard`): server-rendered pages and the
JSON API, each page one module of pages/, the wrapping they share in web.py,
the routes in app.py."""
