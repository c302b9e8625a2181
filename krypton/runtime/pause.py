"""Interruptible sleeps for the operator's background loops."""

from __future__ import annotations

import asyncio


async def pause(stopping: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds` or until `stopping` is set; True when it was set."""
    try:
        async with asyncio.timeout(seconds):
            await stopping.wait()
        return True
    except TimeoutError:
        return False
