"""`rota.__all__` and `rota.testing.__all__` are the public API: exactly the
names docs/reference/python-api.md documents (its mkdocstrings directives),
nothing internal re-exported."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import rota
import rota.errors
import rota.testing

PAGE = Path(__file__).parents[2] / "docs" / "reference" / "python-api.md"


def _documented() -> list[str]:
    """The objects the page renders: each `::: dotted.name` directive."""
    return re.findall(r"^::: ([\w.]+)$", PAGE.read_text(), flags=re.MULTILINE)


def _errors() -> set[str]:
    """What `::: rota.errors` renders: the exceptions the module defines."""
    return {
        name
        for name, value in vars(rota.errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == "rota.errors"
    }


def test_rota_all_is_what_the_reference_documents() -> None:
    documented = _documented()
    assert "rota.errors" in documented
    top = {name.split(".")[1] for name in documented if name.count(".") == 1}
    assert set(rota.__all__) == (top - {"errors"}) | _errors()
    assert len(rota.__all__) == len(set(rota.__all__))
    for name in rota.__all__:
        assert getattr(rota, name) is not None


def test_rota_testing_all_is_what_the_reference_documents() -> None:
    documented = {
        name.removeprefix("rota.testing.")
        for name in _documented()
        if name.startswith("rota.testing.")
    }
    assert set(rota.testing.__all__) == documented


def test_internal_packages_are_not_re_exported() -> None:
    """The packages stay importable (rota.core), but `from rota import *`
    gives none of them, and rota.db (an alias of rota.core.db) is gone."""
    exported = {name: getattr(rota, name) for name in rota.__all__}
    assert not [name for name, value in exported.items() if inspect.ismodule(value)]
    assert not hasattr(rota, "db")
