"""The validation rules Threadloom adds to GraphQL's own, built once per set of limits.

The rule classes are made once (cached) so graphql-core's validation keeps hitting its caches:
per-request factories would make new rule classes each time, about 25 times slower. The schema
adds them to every request; the subscription fast path validates the documents it serves with
the same list. The depth and alias rules are `api.bounds`' (strawberry's messages, but each
fragment counted once: strawberry's walk every spread again, so a fragment bomb never ends), and
every document passes `api.bounds`' linear pre-check before any of these rules runs.
"""

from __future__ import annotations

import functools

from graphql import ASTValidationRule, specified_rules

from threadloom.api.bounds import alias_rule, depth_rule
from threadloom.api.cost import cost_rule
from threadloom.api.input_text import InputTextRule
from threadloom.api.pagination import pagination_rule
from threadloom.config import Limits


@functools.cache
def added_rules(max_depth: int, max_aliases_count: int, max_cost: int, max_page: int) -> list[type]:
    return [
        depth_rule(max_depth),
        alias_rule(max_aliases_count),
        cost_rule(max_cost, max_page=max_page),
        pagination_rule(max_page),
        InputTextRule,  # U+0000 and lone surrogates: INVALID_INPUT naming the field
    ]


def limited_rules(limits: Limits) -> list[type]:
    return added_rules(limits.max_depth, limits.max_aliases, limits.max_query_cost, limits.max_page_size)


@functools.cache
def all_rules(limits: Limits) -> tuple[type[ASTValidationRule], ...]:
    """GraphQL's specified rules followed by ours, as one request's validation runs them."""
    return (*specified_rules, *limited_rules(limits))
