"""The bounds of a listing's page, checked before any read runs (a caller's
numbers go no further unchecked)."""

from __future__ import annotations

from typing import Any

from rota.errors import ValidationError

MAX_PAGE = 1000
MAX_OFFSET = 10**9  # past any real listing; beyond a bigint, PostgreSQL would refuse it


def check_page(offset: Any, limit: Any) -> None:
    if type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
        raise ValidationError(f"offset must be an integer from 0 to {MAX_OFFSET}, got {offset!r}")
    if type(limit) is not int or not 1 <= limit <= MAX_PAGE:
        raise ValidationError(f"limit must be an integer from 1 to {MAX_PAGE}, got {limit!r}")
