"""Automatic persisted queries (Apollo's protocol, version 1).

A client sends `extensions.persistedQuery = {"version": 1, "sha256Hash": <hex>}` without `query`; when this
process knows the hash it runs the query it stands for, else it answers `PERSISTED_QUERY_NOT_FOUND` (HTTP 200,
as Apollo Server does, so every client library recognises it) and the client sends the hash again with the
query, which registers it once its hash is verified. A GET then carries only the hash and the variables: a
short, stable URL that a cache can key on. The hash is checked, never trusted, so one client cannot make a
hash stand for a different query for another client.

The store is per process and bounded (least recently used out): a miss costs the client one round trip,
never a wrong answer, so replicas need not share it and a restart may empty it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import OrderedDict

from strawberry.http import GraphQLRequestData

HASH = re.compile(r"^[0-9a-f]{64}$")
MAX_ENTRIES = 2000
MAX_QUERY_CHARS = 100_000  # one query kept longer than this is not registered (it still runs)


class PersistedQueryError(Exception):
    """A persisted-query request refused before execution: HTTP status, stable code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class PersistedQueries:
    """Hash → query text, least recently used out past `max_entries`."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._queries: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._queries)

    def _remember(self, digest: str, query: str) -> None:
        if len(query) > MAX_QUERY_CHARS:
            return
        self._queries[digest] = query
        self._queries.move_to_end(digest)
        while len(self._queries) > self.max_entries:
            self._queries.popitem(last=False)

    def resolve(self, data: GraphQLRequestData) -> GraphQLRequestData:
        """The request with its query filled in from the hash, or registered; unchanged without the extension."""
        persisted = (data.extensions or {}).get("persistedQuery")
        if persisted is None:
            return data
        if not isinstance(persisted, dict) or persisted.get("version") != 1:
            raise PersistedQueryError(
                400, "PERSISTED_QUERY_VERSION_UNSUPPORTED", "persistedQuery: only version 1 is supported"
            )
        digest = persisted.get("sha256Hash")
        if not isinstance(digest, str) or not HASH.match(digest):
            raise PersistedQueryError(
                400, "PERSISTED_QUERY_BAD_HASH", "persistedQuery.sha256Hash must be 64 lowercase hex digits"
            )
        if data.query is None:
            query = self._queries.get(digest)
            if query is None:
                raise PersistedQueryError(200, "PERSISTED_QUERY_NOT_FOUND", "PersistedQueryNotFound")
            self._queries.move_to_end(digest)
            return dataclasses.replace(data, query=query)
        if hashlib.sha256(data.query.encode()).hexdigest() != digest:
            raise PersistedQueryError(
                400, "PERSISTED_QUERY_HASH_MISMATCH", "persistedQuery.sha256Hash is not the SHA-256 of the query"
            )
        self._remember(digest, data.query)
        return data
