"""Text PostgreSQL cannot store is refused before anything runs, with the field that carries it.

PostgreSQL `text` and `jsonb` cannot hold U+0000, and a lone UTF-16 surrogate (U+D800..U+DFFF
without its pair; JSON's `"\\ud800"` decodes to one) cannot be encoded as UTF-8 at all. Such a
string reaching a mutation used to fail deep in the database driver: `INTERNAL_SERVER_ERROR`, a
traceback in the log, and for some commands a half-written receipt. One validation rule refuses
it everywhere instead: every string literal of the document (arguments, input-object fields,
list items, variable defaults, directive arguments) and every string inside a variable's value
(nested input objects and lists, `JSON` values' keys too), over HTTP and WebSocket alike, since
both validate through the schema. The answer is a request error with `extensions.code`
`INVALID_INPUT` and `extensions.field` naming the input field at fault; nothing is executed.

Other control characters are allowed: tabs and newlines belong in messages, and PostgreSQL
stores the rest of C0/C1 as it stores any character (what a client shows them as is its own
affair). GraphQL's lexer already refuses a lone surrogate written as an escape in the document.

The rule reads the request's variables (`cost.request_variables`), so it is one of the
variable rules `compiled.CachedDocuments` runs per request (`VARIABLE_RULE_MODULES`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from graphql import (
    ArgumentNode,
    GraphQLError,
    Node,
    ObjectFieldNode,
    StringValueNode,
    ValidationRule,
    VariableDefinitionNode,
    VariableNode,
)

from threadloom.api.cost import request_variables
from threadloom.domain.errors import ErrorCode

# What PostgreSQL text cannot hold: NUL, and surrogates (Python keeps a lone one from JSON as is;
# a paired one is already decoded into its character, so any surrogate left here is unpaired).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable(text: str) -> bool:
    """Whether `text` holds a character PostgreSQL cannot store."""
    return UNSTORABLE.search(text) is not None


def find_unstorable(value: Any, field: str) -> str | None:
    """The input field (innermost object key) holding an unstorable string in a variable's value.

    `field` names the value itself (where the variable is used); None when every string is fine.
    """
    if isinstance(value, str):
        return field if unstorable(value) else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            name = str(key)
            if unstorable(name):
                return field
            found = find_unstorable(item, name)
            if found is not None:
                return found
        return None
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        for item in value:
            found = find_unstorable(item, field)
            if found is not None:
                return found
    return None


def _site(parent: Any, ancestors: Sequence[Any]) -> str | None:
    """The argument, input-object field or variable a value is written for (innermost first)."""
    for node in (parent, *reversed(ancestors)):
        if isinstance(node, ObjectFieldNode | ArgumentNode):
            return node.name.value
        if isinstance(node, VariableDefinitionNode):
            return node.variable.name.value
    return None


def refusal(field: str | None, node: Node | None = None) -> GraphQLError:
    """The request error for an unstorable string in `field`."""
    name = field or "input"
    message = f"{name} contains a character that cannot be stored (U+0000 or an unpaired surrogate)"
    return GraphQLError(message, node, extensions={"code": ErrorCode.INVALID_INPUT.value, "field": field})


class InputTextRule(ValidationRule):
    """Refuses a string literal or variable value holding U+0000 or a lone surrogate (see the module)."""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self._checked: set[str] = set()  # variables already looked at: one error per variable

    def enter_string_value(
        self, node: StringValueNode, _key: Any, parent: Any, _path: Any, ancestors: list[Any]
    ) -> None:
        if unstorable(node.value):
            self.report_error(refusal(_site(parent, ancestors), node))

    def enter_variable(self, node: VariableNode, _key: Any, parent: Any, _path: Any, ancestors: list[Any]) -> None:
        if isinstance(parent, VariableDefinitionNode):
            return  # the declaration; its uses are where the value goes
        name = node.name.value
        if name in self._checked:
            return
        self._checked.add(name)
        variables = request_variables()
        if name not in variables:
            return
        found = find_unstorable(variables[name], _site(parent, ancestors) or name)
        if found is not None:
            self.report_error(refusal(found, node))
