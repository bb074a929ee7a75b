"""One-line labels the user names things with (project names, thread titles)."""

from __future__ import annotations

from threadloom.domain.errors import DomainError, ErrorCode


def clean_label(text: str, field: str, limit: int) -> str:
    """`text` with its white space folded to single spaces; refused when blank or longer than `limit`."""
    cleaned = " ".join(text.split())
    if not cleaned:
        raise DomainError(ErrorCode.INVALID_INPUT, f"{field} must not be blank", field)
    if len(cleaned) > limit:
        raise DomainError(ErrorCode.INVALID_INPUT, f"{field} is longer than {limit} characters", field)
    return cleaned
