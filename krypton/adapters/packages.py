"""Importing a library's modules without its package's own imports.

A few libraries import far more in their ``__init__`` than krypton uses:
``kubernetes/__init__.py`` loads the whole synchronous client (requests, urllib3, oauthlib,
websocket-client, the informer), ``kubernetes/aio/__init__.py`` the asyncio watch, stream,
dynamic and leader-election modules, and ``pyhelm3/__init__.py`` its client and its pydantic
models, and ``kubernetes/aio/config/__init__.py`` the kubeconfig loader, which needs the
generated API client and with it pydantic and dateutil. Together that is about 370 modules
and 18 MiB of the operator's memory, and their import time, none of it used: krypton imports
only the modules it needs (the client's configuration, REST pool and exceptions, the
in-cluster loader, ``pyhelm3.command``, ``pyhelm3.errors``), and the kubeconfig loader
when a kubeconfig needs it.

:func:`without_init` registers such a package from its spec without running its
``__init__``; its submodules then import as usual.
"""

from __future__ import annotations

import importlib.util
import sys


def without_init(*names: str) -> None:
    """Registers the packages `names` (parents first) without running their ``__init__``.
    A package imported before (the synchronous client of the tests) is left as it is; one
    that is not installed as a package is left to the import that follows, to fail or work
    as usual."""
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.submodule_search_locations is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
