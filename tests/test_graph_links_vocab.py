"""The typed vocabularies cover every value the domain can produce, and the cost rule prices each new link.

Pure: no server. `RuntimeMode` has a member for each of `domain.threads.RUNTIME_MODES`; `ThreadEventType`
for every `<entity>.<verb>` `domain.changes.event_type` can name and the two stream markers; `ActivityKind`
is the domain's own enum. The cost rule counts a list or connection at its page size for each parent item and
an object link at nothing (the node limit counts objects returned by lists, as GitHub's does).
"""

from __future__ import annotations

from typing import Any

import pytest
from graphql import FragmentDefinitionNode, OperationDefinitionNode, parse

from threadloom.api import vocab
from threadloom.api.cost import operation_cost
from threadloom.api.schema import build_schema
from threadloom.domain.activities import ActivityKind
from threadloom.domain.changes import EventVerb, event_type
from threadloom.domain.entities import ENTITY_TYPES, Activity, AppThread, UsageRecord
from threadloom.domain.threads import RUNTIME_MODES

SCHEMA = build_schema()._schema


def test_runtime_mode_names_every_mode_the_domain_accepts() -> None:
    assert {m.value for m in vocab.RuntimeMode} == set(RUNTIME_MODES)
    assert vocab.runtime_mode("workspace_write") is vocab.RuntimeMode.WORKSPACE_WRITE
    assert vocab.runtime_mode("no such mode") is None and vocab.runtime_mode(None) is None


def test_thread_event_type_names_every_event_the_log_can_hold() -> None:
    appended_once = {Activity, UsageRecord}  # never updated: activities are recorded, usage records created
    possible = {
        event_type(e, v) for e in ENTITY_TYPES if e not in appended_once for v in (EventVerb.CREATED, EventVerb.UPDATED)
    }
    possible |= {event_type(UsageRecord, EventVerb.CREATED)}
    thread_verbs = (EventVerb.RENAMED, EventVerb.ARCHIVED, EventVerb.UNARCHIVED, EventVerb.LEASED)
    possible |= {event_type(AppThread, v) for v in thread_verbs}
    possible |= {event_type(Activity, EventVerb.RECORDED), "synchronized", "reload_required"}
    assert possible == {t.value for t in vocab.ThreadEventType}
    assert vocab.thread_event_type("run.updated") is vocab.ThreadEventType.RUN_UPDATED


def test_activity_kind_in_the_schema_is_the_domains_enum() -> None:
    enum = SCHEMA.type_map["ActivityKind"]
    assert set(enum.values) == {k.name for k in ActivityKind}  # type: ignore[attr-defined]
    assert vocab.activity_kind("run.started") is ActivityKind.RUN_STARTED
    assert vocab.activity_kind("gone.kind") is None


def cost(query: str) -> int:
    document = parse(query)
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    [operation] = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    return operation_cost(SCHEMA, operation, fragments, {})


T = '{ thread(id: "x") { %s } }'


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        # connections: their page (first/last, else the default 20)
        (T % "contextTransfers(first: 7) { nodes { id } }", 7),
        (T % "contextTransfers { nodes { id } }", 20),
        (T % "lineage { delegatedChildren(first: 3) { nodes { id } } mergeBacks(last: 4) { nodes { id } } }", 7),
        (T % "providerThreads { turns(first: 5) { nodes { id } } runs(first: 2) { nodes { id } } }", 20 + 20 * 7),
        (T % "checkpoints(first: 2) { nodes { scope { checkpoints(first: 3) { nodes { id } } } } }", 2 + 2 * 3),
        # plain lists: the default page for each parent
        (T % "runs(first: 2) { nodes { forks { id } } }", 2 + 2 * 20),
        (T % "runs(first: 2) { nodes { contextHandoff { fromProviderThreads { id } } } }", 2 + 2 * 20),
        # object links: nothing beyond their parents
        (
            T % "runs(first: 2) { nodes { contextHandoff { thread { id } toProviderThread { id } } "
            "providerInstance { id } forks { id } } }",
            2 + 2 * 20,
        ),
        (T % "activities(first: 4) { nodes { run { id } node { id } thread { id } } }", 4),
        (
            T % "contextTransfers(first: 3) { nodes { source { ... on RunPoint { run { id } checkpoint { id } } } "
            "base { ... on ProviderTurnPoint { providerThread { id } } } } }",
            3,
        ),
        (T % "runs(first: 1) { nodes { attempts { providerThread { id } providerTurn { id } } } }", 1 + 20),
        (T % "providerThreads { ownerNode { id } providerInstance { id } }", 20),
    ],
)
def test_the_cost_rule_prices_each_new_link(query: str, expected: Any) -> None:
    assert cost(query) == expected
