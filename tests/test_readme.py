"""The README's tour, run as written against a real server."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.server import Client

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _tour_folder() -> None:
    Path("/tmp/demo").mkdir(exist_ok=True)  # the tour's `mkdir -p /tmp/demo`: projects need an existing folder


async def test_tour_blocks_run_as_written(client: Client) -> None:
    _tour_folder()
    blocks = re.findall(r"```graphql\n(.*?)```", README, re.S)
    assert len(blocks) >= 6
    ids: dict[str, str] = {}
    for block in blocks:
        if block.lstrip().startswith("subscription"):
            continue  # subscriptions are covered by the stream tests
        for name, value in ids.items():
            block = block.replace(name, value)
        data = await client.gql(block)
        for payload in data.values():
            if isinstance(payload, dict) and "userErrors" in payload:
                assert payload["userErrors"] == [], payload
        if "createProject" in data:
            ids["PROJECT_ID"] = data["createProject"]["project"]["id"]
        if "createThread" in data:
            ids["THREAD_ID"] = data["createThread"]["thread"]["id"]
    assert set(ids) == {"PROJECT_ID", "THREAD_ID"}
