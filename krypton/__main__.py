"""Entry point: ``krypton [run|crds] [flags]`` (also ``python -m krypton``).

Flags and environment are parsed and checked before any cluster is touched; a bad value or
a missing helm prints one line and exits with status 2 (SPEC O1).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from . import settings as settings_mod
from .errors import SettingsError

COMMANDS = ("run", "crds")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="krypton",
        description="Roll one centrally configured Helm chart out to every Tenant on a fleet "
                    "of Kubernetes clusters.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="run the operator (default)",
                         description="Run the operator. Flag > environment > default.")
    settings_mod.add_arguments(run)
    sub.add_parser("crds", help="print the Tenant CRD")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or (args_list[0].startswith("-") and args_list[0] not in ("-h", "--help")):
        args_list = ["run", *args_list]
    args = build_parser().parse_args(args_list)
    if args.command == "crds":
        from .crd import crd_text

        sys.stdout.write(crd_text())
        return 0
    try:
        settings = settings_mod.load(args)
    except SettingsError as exc:
        print(f"krypton: {exc}", file=sys.stderr)
        return 2
    import faulthandler
    import signal

    from . import log
    from .app import Operator

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack
    log.configure(settings.log_format, settings.log_level)
    os.environ["HELM_DRIVER"] = settings.helm_driver  # inherited by every helm process
    return asyncio.run(Operator(settings).run())


if __name__ == "__main__":
    sys.exit(main())
