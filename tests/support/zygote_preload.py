"""What the forkserver of tests/support/zygote.py imports once: the modules every `threadloom serve` needs."""

import uvicorn
import uvicorn.lifespan.on
import uvicorn.loops.auto
import uvicorn.protocols.http.auto
import uvicorn.protocols.websockets.websockets_sansio_impl  # noqa: F401

import threadloom.app
import threadloom.cli  # noqa: F401
