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

aiohttp makes two TLS contexts when it is imported (``aiohttp.connector``), for sessions that
bring none of their own, and each reads the system's whole CA bundle: about 35 ms of CPU and
2 MiB at every start. krypton never uses them: every connection it opens carries the context
of its cluster's client configuration. :func:`import_without_ca_file` imports such a module
with that bundle left unread.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
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


def import_without_ca_file(name: str) -> None:
    """Imports `name` with OpenSSL's CA file (``SSL_CERT_FILE``) pointed at an empty file,
    then sets the variable back as it was, before anything else runs: TLS contexts made
    during that import hold none of the bundle's certificates (they still look certificates
    up in the CA directory, one at a time, when they verify), every context made later reads
    the bundle as usual, and helm inherits the operator's own setting."""
    if name in sys.modules:
        return
    saved = os.environ.get("SSL_CERT_FILE")
    os.environ["SSL_CERT_FILE"] = os.devnull
    try:
        importlib.import_module(name)
    finally:
        if saved is None:
            del os.environ["SSL_CERT_FILE"]
        else:
            os.environ["SSL_CERT_FILE"] = saved
