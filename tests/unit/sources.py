"""Reading krypton's own source in unit tests."""

from __future__ import annotations

import ast
import gc


def parse(text: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse with the garbage collector held: a finalizer run in the middle of it (an
    asyncio subprocess transport another test of the same process left behind) upsets
    CPython 3.11's count of the AST constructor's recursion ("SystemError: AST constructor
    recursion depth mismatch")."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(text, filename)
    finally:
        if enabled:
            gc.enable()
