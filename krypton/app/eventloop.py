"""The event loop the operator runs on: uvloop's (libuv), given to the runner that starts
`krypton run`; nothing process-wide is set, and the CLI's short commands keep asyncio's own.

Chosen by measurement (docs/benchmarks.md, "The event loop"): an idle TLS connection (an
engaged cluster holds two, its watches) keeps about 67 KiB on it, against 309 KiB on
asyncio's loop, whose TLS allocates and zero-fills a 256 KiB receive buffer for every
connection; a request costs the same CPU or less. It hears of a helm process's exit through
libuv's own SIGCHLD handling: no thread per child and no child watcher to install.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on a new uvloop event loop, closed when it returns."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
