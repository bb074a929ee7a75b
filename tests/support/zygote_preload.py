"""What the forkserver of tests/support/zygote.py does once for every server it forks: import the modules a
`threadloom serve` needs, build the schema each fork takes (`prebuild_schema`), read the migrations' head,
and move the whole heap out of the garbage collector's sight (`gc.freeze`), so each
fork's first full collection walks only what the fork made. What a start imports on its way (the database
driver, the event loop, the memory wake-ups, logging's setup) is imported here too: ~30 ms a fork otherwise."""

import gc
import getpass  # noqa: F401
import stringprep  # noqa: F401  (asyncpg's SCRAM login)

import asyncpg  # noqa: F401
import broadcaster._backends.memory  # noqa: F401
import sqlalchemy.dialects.postgresql.asyncpg  # noqa: F401
import uvicorn
import uvicorn.lifespan.on
import uvicorn.loops.auto
import uvicorn.loops.uvloop
import uvicorn.protocols.http.auto
import uvicorn.protocols.websockets.websockets_sansio_impl  # noqa: F401
import uvloop  # noqa: F401

import threadloom.app
import threadloom.cli
import threadloom.logs  # noqa: F401
from threadloom.api.schema import prebuild_schema
from threadloom.store.migrate import head_revision

prebuild_schema()  # each fork takes it, with the default limits (a server with other limits builds its own)
head_revision()
gc.collect()
gc.freeze()
