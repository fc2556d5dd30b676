"""rota inside web frameworks' transactions: `rota.contrib.django` (an app:
settings, enqueue in or after the request's transaction, `manage.py
rota_worker`) and `rota.contrib.sqlalchemy` (in or after a Session's
transaction). rota's own modules never import these, nor the frameworks."""
