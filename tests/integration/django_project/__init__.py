"""A small Django project for tests/integration/test_contrib_django.py: one
model, one task, rota's app installed. The test configures it in process;
`manage.py rota_worker` runs it in a subprocess (settings from ROTA_*)."""
