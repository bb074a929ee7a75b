"""Pure rules behind the API's limits: the static query cost and the workspace root rule."""

from __future__ import annotations

from typing import Any

import pytest
from graphql import FragmentDefinitionNode, OperationDefinitionNode, parse, validate

from threadloom.api.cost import cost_rule, operation_cost
from threadloom.api.schema import build_schema
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.projects import check_not_system, check_workspace_root
from threadloom.providers.agent_cli import permitted
from threadloom.providers.contract import ThreadSettings

SCHEMA = build_schema()._schema


def cost(query: str, variables: dict[str, Any] | None = None) -> int:
    document = parse(query)
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    [operation] = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    return operation_cost(SCHEMA, operation, fragments, variables)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("{ viewer { scope } }", 0),
        ("{ projects { totalCount } }", 20),  # the default page
        ("{ projects(first: 5) { edges { node { id } } nodes { id } } }", 5),  # edges/nodes are the page
        ("{ projects(last: 500) { nodes { id } } }", 100),  # never more than the largest page
        ("{ projects(first: 2) { nodes { threads(first: 3) { nodes { runs(first: 4) { nodes { id } } } } } } }",
         2 + 2 * 3 + 2 * 3 * 4),
        ("{ a: projects(first: 10) { nodes { id } } b: projects(first: 10) { nodes { id } } }", 20),  # aliases
        ('{ nodes(ids: ["a", "b", "c"]) { id } }', 3),
        ("{ providerInstances { id } }", 20),  # a plain list counts with the default page
        ('{ thread(id: "x") { runs(first: 2) { nodes { attempts { id } } } } }', 2 + 2 * 20),
        ("{ __schema { types { fields { args { name } } } } }", 0),  # introspection is bounded by the schema
        ("query { ...F } fragment F on Query { projects(first: 7) { nodes { id } } }", 7),
        ('{ node(id: "x") { ... on Thread { messages(first: 9) { nodes { id } } } } }', 9),
    ],
)  # fmt: skip
def test_cost_multiplies_page_sizes_down_the_tree(query: str, expected: int) -> None:
    assert cost(query) == expected


def test_cost_reads_variables_and_their_defaults() -> None:
    query = "query($n: Int = 4, $m: Int) { projects(first: $n) { nodes { threads(first: $m) { nodes { id } } } } }"
    assert cost(query) == 4 + 4 * 20
    assert cost(query, {"n": 10, "m": 10}) == 10 + 100
    assert cost("query($ids: [ID!]!) { nodes(ids: $ids) { id } }", {"ids": ["a"] * 7}) == 7


def test_a_fragment_cycle_does_not_hang() -> None:
    query = "query { ...A } fragment A on Query { projects(first: 2) { nodes { id } } ...A }"
    assert cost(query) == 2


def test_the_rule_refuses_over_budget_with_the_figures() -> None:
    rule = cost_rule(100)
    assert rule is cost_rule(100)  # built once per budget
    errors = validate(SCHEMA, parse("{ projects(first: 10) { nodes { threads(first: 10) { totalCount } } } }"), [rule])
    [error] = errors
    assert error.extensions == {"code": "QUERY_TOO_COSTLY", "cost": 110, "maxCost": 100}
    assert validate(SCHEMA, parse("{ projects(first: 10) { nodes { id } } }"), [rule]) == []


DATA = "/srv/threadloom/data"


@pytest.mark.parametrize(
    ("root", "existing", "code"),
    [
        ("/", [], ErrorCode.INVALID_WORKSPACE_ROOT),
        ("/etc", [], ErrorCode.INVALID_WORKSPACE_ROOT),
        ("/etc/nginx", [], ErrorCode.INVALID_WORKSPACE_ROOT),
        ("/usr/local/src", [], ErrorCode.INVALID_WORKSPACE_ROOT),
        ("/proc/1/root", [], ErrorCode.INVALID_WORKSPACE_ROOT),
        ("/home", [], ErrorCode.INVALID_WORKSPACE_ROOT),
        ("/root", [], ErrorCode.INVALID_WORKSPACE_ROOT),
        ("/tmp", [], ErrorCode.INVALID_WORKSPACE_ROOT),
        (DATA, [], ErrorCode.INVALID_WORKSPACE_ROOT),
        ("/srv/threadloom", [], ErrorCode.INVALID_WORKSPACE_ROOT),
        ("/work/a", ["/work/a"], ErrorCode.WORKSPACE_OVERLAPS),
        ("/work/a/b", ["/work/a"], ErrorCode.WORKSPACE_OVERLAPS),
        ("/work", ["/work/a"], ErrorCode.WORKSPACE_OVERLAPS),
    ],
)
def test_workspace_root_refuses_system_data_and_overlapping_folders(
    root: str, existing: list[str], code: ErrorCode
) -> None:
    with pytest.raises(DomainError) as refused:
        check_workspace_root(root, existing=existing, data_dir=DATA)
    assert refused.value.code == code
    assert refused.value.field == "workspaceRoot"


@pytest.mark.parametrize(
    ("root", "existing"),
    [
        ("/work/a", []),
        ("/work/ab", ["/work/a"]),  # a common prefix is not nesting
        ("/tmp/demo", ["/work/a"]),
        ("/home/alice/project", []),
        ("/root/project", []),
        (DATA + "-other", []),
    ],
)
def test_workspace_root_accepts_ordinary_folders(root: str, existing: list[str]) -> None:
    check_workspace_root(root, existing=existing, data_dir=DATA)


@pytest.mark.parametrize("given", ["/proc/self/cwd", "/proc/1/root/home/x", "/sys/kernel", "/etc"])
def test_a_path_given_through_a_system_tree_is_refused(given: str) -> None:
    with pytest.raises(DomainError) as refused:
        check_not_system(given)
    assert refused.value.code == ErrorCode.INVALID_WORKSPACE_ROOT


@pytest.mark.parametrize("root", ["/opt/venv", "/opt/venv/lib/x", "/opt"])
def test_the_servers_installation_is_never_a_workspace(root: str) -> None:
    with pytest.raises(DomainError) as refused:
        check_workspace_root(root, existing=[], data_dir=DATA, install_dirs=["/opt/venv"])
    assert refused.value.code == ErrorCode.INVALID_WORKSPACE_ROOT


@pytest.mark.parametrize(
    ("mode", "allowed", "effective"),
    [
        ("full_access", False, "workspace_write"),
        ("full_access", True, "full_access"),
        ("read_only", False, "read_only"),
        ("approval_required", True, "approval_required"),
    ],
)
def test_a_driver_never_opens_full_access_the_instance_does_not_allow(mode: str, allowed: bool, effective: str) -> None:
    assert permitted(ThreadSettings(cwd="/w", runtime_mode=mode), allowed).runtime_mode == effective
