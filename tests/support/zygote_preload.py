"""What the forkserver of tests/support/zygote.py does once for every server it forks: import the modules a
`threadloom serve` needs, build the schema once (strawberry's first build fills caches a second one reuses:
0.10 s against 0.03 s), and move the whole heap out of the garbage collector's sight (`gc.freeze`), so each
fork's first full collection walks only what the fork made."""

import gc

import uvicorn
import uvicorn.lifespan.on
import uvicorn.loops.auto
import uvicorn.protocols.http.auto
import uvicorn.protocols.websockets.websockets_sansio_impl  # noqa: F401

import threadloom.app
import threadloom.cli  # noqa: F401
from threadloom.api.schema import build_schema
from threadloom.config import Limits

build_schema(Limits())
gc.collect()
gc.freeze()
