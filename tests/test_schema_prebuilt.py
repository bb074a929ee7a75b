"""`prebuild_schema`: a process that forks servers builds the schema once; each build with the same limits
and dev flag takes it once, any other build makes its own."""

from __future__ import annotations

from threadloom.api.schema import build_schema, prebuild_schema
from threadloom.config import Limits


def test_a_prebuilt_schema_is_taken_once_and_only_by_a_build_with_the_same_limits_and_dev_flag() -> None:
    limits = Limits(max_depth=7)
    prebuilt = prebuild_schema(limits)
    assert build_schema(Limits(max_depth=8)) is not prebuilt  # other limits: a schema of their own
    assert build_schema(limits, dev=True) is not prebuilt  # the dev flag differs
    taken = build_schema(limits)
    assert taken is prebuilt
    again = build_schema(limits)
    assert again is not prebuilt  # taken once: a second server in this process builds its own
    assert again.as_str() == prebuilt.as_str()
