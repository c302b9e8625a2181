"""Entry point: ``krypton COMMAND [flags]`` (also ``python -m krypton``).

``krypton`` alone prints help: the operator starts only with ``krypton run``. Flags and
environment are parsed and checked before any cluster is touched; a bad value or a missing
helm prints one line and exits with status 2 (SPEC O1); a misspelt flag or command gets a
suggestion.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from krypton.app import config
from krypton.decisions import settings as settings_mod
from krypton.decisions.deployed import NAME_LABEL
from krypton.decisions.errors import SettingsError

TOOLS = ("status", "plan", "diff", "register-cluster", "retry", "adopt-records",
         "rotate-record-key", "rollout")
CHART_OPTIONS = ("chart_repo", "chart_name", "chart_version")


class Parser(argparse.ArgumentParser):
    """argparse with a suggestion for an unknown flag or command, shown with the usage of
    the command it was given to (not the top-level one)."""

    commands: Mapping[str, argparse.ArgumentParser]  # the subcommands' parsers, by name

    def error(self, message: str) -> NoReturn:
        known = [o for a in self._actions for o in a.option_strings]
        known += [c for a in self._actions if isinstance(a, argparse._SubParsersAction)  # noqa: SLF001
                  for c in a.choices]
        hints = []
        for word in re.findall(r"--[\w-]+|(?<=invalid choice: ')[^']+", message):
            close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close and close[0] != word else ""
            if hint and hint not in hints:
                hints.append(hint)
        self.print_usage(sys.stderr)
        hint = f" ({'; '.join(hints)})" if hints else ""
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")


def build_parser() -> Parser:
    parser = Parser(
        prog="krypton",
        description="Roll one centrally configured Helm chart out to every Tenant on a fleet "
                    "of Kubernetes clusters.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    add = sub.add_parser
    tools = [*_fleet_commands(add), _register_command(add), *_release_commands(add),
             _rollout_command(add)]
    _printing_commands(add)
    for tool in tools:
        tool.add_argument(
            "--from-deployment", metavar="NAMESPACE/NAME",
            help="take the settings this command leaves unset (no flag, no environment "
                 "variable) from the operator Deployment NAMESPACE/NAME on the cluster of "
                 "--watch-kubeconfig or the kube context; none: do not [env "
                 "$KRYPTON_FROM_DEPLOYMENT; default: the one Deployment labelled "
                 f"{NAME_LABEL} that runs `krypton run`, if there is exactly one]")
    parser.commands = sub.choices
    return parser


AddCommand = Callable[..., argparse.ArgumentParser]  # a subparsers' add_parser


def _fleet_commands(add: AddCommand) -> list[argparse.ArgumentParser]:
    """run, and what shows the fleet: plan, diff, status."""
    run = add("run", help="run the operator", allow_abbrev=False,
                         description="Run the operator. Flag > environment > default.")
    settings_mod.add_arguments(run)
    plan = add(
        "plan", help="dry run: what the next reconcile would do per Tenant x cluster",
        allow_abbrev=False,
        description="Show, for every Tenant on every discovered cluster, what the operator's "
                    "next pass would do (install, upgrade, skip, blocked) and why. Takes the "
                    "flags of `run`. Exit status 0: nothing would change and nothing is "
                    "blocked; 2: something would change or is blocked; 1: an error.")
    settings_mod.add_arguments(plan)
    plan.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    diff = add(
        "diff", help="per Tenant x cluster: deployed manifest vs what the next reconcile applies",
        allow_abbrev=False,
        description="For every Tenant on every discovered cluster, the unified diff between "
                    "the manifest of its deployed release and what the next reconcile would "
                    "apply (helm template of the target chart with the cluster's effective "
                    "values). Values of Secrets are masked. Takes the flags of `run`. Exit "
                    "status 0: no differences; 2: differences; 1: an error.")
    settings_mod.add_arguments(diff)
    status = add(
        "status", help="fleet table: Tenants x clusters with phase, release, chart version",
        allow_abbrev=False, description="Print the fleet. Takes the flags of `run`.")
    settings_mod.add_arguments(status)
    status.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    status.add_argument("-w", "--watch", action="store_true",
                        help="keep watching: a new table (and the rollout's progress) on every "
                             "change, until Ctrl-C")
    status.add_argument("--wide", action="store_true",
                        help="add the MESSAGE column (each Tenant's Ready message)")
    return [plan, diff, status]


def _register_command(add: AddCommand) -> argparse.ArgumentParser:
    reg = add(
        "register-cluster", help="create the labelled, self-contained kubeconfig Secret",
        allow_abbrev=False,
        description="Inline and reduce a kubeconfig to one context, check it (no exec or "
                    "auth-provider users, no file references, valid certificates), probe the "
                    "server's /version, and write the labelled Secret in --namespace of the "
                    "watch cluster. Exit status 2 when the kubeconfig is refused.")
    reg.add_argument("name", help="cluster name (the Secret's name)")
    reg.add_argument("--kubeconfig", required=True, help="kubeconfig file of the cluster")
    reg.add_argument("--context", help="context to use (default: current-context)")
    reg.add_argument("--values", help="per-cluster values.yaml stored in the Secret")
    reg.add_argument("--overwrite", action="store_true",
                     help="replace an existing Secret of that name (refused without it; the "
                          "output says which server it pointed at before and after)")
    settings_mod.add_arguments(reg)
    return reg


def _printing_commands(add: AddCommand) -> None:
    """What prints manifests for an admin to apply: crds, guard."""
    add("crds", help="print the Tenant CRD")
    guard = add(
        "guard", help="print the guard of krypton's release records, for an admin to apply",
        allow_abbrev=False,
        description="Print the ValidatingAdmissionPolicy and its binding that let only USER "
                    "create, change or delete the Helm release records of krypton's releases "
                    "(SPEC S4). krypton installs them itself when it engages a cluster "
                    "(--record-guard=install); on a cluster where it may not, an admin applies "
                    "these (`krypton guard --print --user U | kubectl apply -f -`) and krypton "
                    "finds them (--record-guard=check).")
    guard.add_argument("--print", dest="print_", action="store_true", required=True,
                       help="print the manifests as YAML")
    guard.add_argument("--user", required=True,
                       help="the user krypton's credentials authenticate as on the cluster "
                            "(kubectl auth whoami with krypton's kubeconfig)")
    guard.add_argument("--watch-namespace", default="",
                       help="the WATCH_NAMESPACE of a namespaced krypton instance")
    guard.add_argument("--release-namespace", choices=("tenant", "watch"), default="tenant",
                       help="where the instance's releases go (as its --release-namespace)")


def _release_commands(add: AddCommand) -> list[argparse.ArgumentParser]:
    """What asks the operator for something on a Tenant's release: retry, adopt-records;
    and rotate-record-key."""
    def tenant_command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        """A command on one Tenant, on every discovered cluster that has it or one."""
        command = add(name, help=summary, allow_abbrev=False,
                                 description=description)
        command.add_argument("tenant", metavar="NAMESPACE/NAME", help="the Tenant")
        command.add_argument("--cluster", help="only on this cluster")
        settings_mod.add_arguments(command)
        return command

    again = tenant_command(
        "retry", "ask for a new attempt of a Tenant's failed or stalled release",
        "Set the annotation mesh.openkcm.io/retry to a new value on the Tenant, on every "
        "discovered cluster that has it (or on --cluster): a release stalled after "
        "--max-retries failures (RetriesExhausted), or waiting for its next attempt, is tried "
        "again at once with a fresh budget. Takes the flags of `run`. Exit status 0: asked on "
        "at least one cluster; 1: the Tenant was found nowhere.")
    adopt = add(
        "adopt-records", help="adopt release records as krypton's, as they are",
        allow_abbrev=False,
        description="Ask the operator to adopt the deployed and superseded release records "
        "of a Tenant's release as they are, on every discovered cluster that has it (or on "
        "--cluster), or with --all those of every Tenant whose release krypton refused for "
        "its records (ReleaseRecordUntrusted): an administrator's explicit act for records "
        "krypton keeps no seal of and did not adopt by their content (SPEC S6). Their seals "
        "go into the Tenant's annotation mesh.openkcm.io/adopt-records; the operator's next "
        "pass believes them and keeps them in the Tenant's status, with an Event. Look "
        "first (--dry-run lists each release and what krypton said of it; helm history, "
        "helm get manifest): whatever the records list, krypton's helm will act on. Takes "
        "the flags of `run`. Exit status 0: asked for or said why not; 1: the Tenant was "
        "found nowhere.")
    adopt.add_argument("tenant", metavar="NAMESPACE/NAME", nargs="?", help="the Tenant")
    adopt.add_argument("--all", action="store_true",
                       help="every Tenant whose release is refused for its records")
    adopt.add_argument("--cluster", help="only on this cluster")
    adopt.add_argument("--dry-run", action="store_true",
                       help="list what would be adopted and what krypton said of it")
    settings_mod.add_arguments(adopt)
    rotate = add(
        "rotate-record-key", help="rotate the key that seals release records",
        allow_abbrev=False,
        description="Make a new key for sealing release records (Secret krypton-record-key in "
                    "--namespace) and retire the current one: it still checks the seals it "
                    "made. Restart the operator to seal with the new key. With --prune, drop "
                    "instead the retired keys that no Tenant's seals use any more, on every "
                    "discovered cluster (SPEC S4). Takes the flags of `run`.")
    rotate.add_argument("--prune", action="store_true",
                        help="drop the retired keys no seal uses any more")
    settings_mod.add_arguments(rotate)
    return [again, adopt, rotate]


def _rollout_command(add: AddCommand) -> argparse.ArgumentParser:
    control = add(
        "rollout", help="approve a wave of the fleet rollout, pause, resume or abort it, or "
                        "show its history", allow_abbrev=False,
        description="Control the progressive rollout (SPEC F9) by writing an annotation on "
                    "its state ConfigMap krypton-rollout in --namespace of the watch cluster, "
                    "naming the rollout's target: approve lets the wave that waits for "
                    "approval open (--rollout-approval); pause holds every helm run of the "
                    "rollout until resume; abort ends it, halted (with --rollout-auto-revert "
                    "the failed releases go back). history shows the last rollouts. Takes the "
                    "flags of `run`. Exit status 0: written (or shown); 1: nothing changed "
                    "(no rollout running, nothing waiting, another operator format), or an "
                    "error.")
    control.add_argument("action", choices=("approve", "pause", "resume", "abort", "history"))
    control.add_argument("--by", default="",
                         help="who acts, as recorded in the history and the Events "
                              "[default: USER@HOST]")
    settings_mod.add_arguments(control)
    return control


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; a reader that stops reading early (``krypton diff | head``) ends
    the command quietly, as a closed pipe ends any other command line tool."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, where a closed pipe can still be handled
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail
        return 141  # 128 + SIGPIPE, as a shell reports a command a pipe closed on


def _main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not args_list:
        parser.print_help()
        return 0
    if args_list[0].startswith("-") and args_list[0] not in ("-h", "--help"):
        parser.print_usage(sys.stderr)
        print(f"krypton: error: no command before {args_list[0]} (the operator is "
              f"`krypton run {args_list[0]} ...`)", file=sys.stderr)
        return 2
    args, extra = parser.parse_known_args(args_list)
    if extra:  # reported by the command's own parser: its usage, its flags to suggest
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "watch", False) and args.output != "table":
        parser.commands["status"].error("--watch shows a table: it takes no -o")
    if args.command in ("crds", "guard"):
        return _print(parser, args)
    if args.command in TOOLS:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="krypton-cli-") as private:
            try:
                _inherit(args, private)
                settings = config.load(args, check_helm=args.command in ("plan", "diff"))
            except SettingsError as exc:
                from krypton.decisions.trust.printable import escape

                print(f"krypton: {escape(str(exc))}", file=sys.stderr)
                return 2
            return _tool(args, settings)
    try:
        settings = config.load(args)
        if settings.cluster_profiles and not settings.profile_providers:
            raise SettingsError("invalid --cluster-profiles: --cluster-profile-providers names "
                                "the plugins that reach the profiles' clusters")
    except SettingsError as exc:
        print(f"krypton: {exc}", file=sys.stderr)
        return 2
    import faulthandler
    import signal

    from krypton.app import log
    from krypton.app.operator import Operator

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack
    log.configure(settings.log_format, settings.log_level)
    return asyncio.run(Operator(settings).run())


def _print(parser: Parser, args: argparse.Namespace) -> int:
    """crds and guard: manifests printed for an admin to apply."""
    if args.command == "crds":
        from krypton.decisions.crd import crd_text

        sys.stdout.write(crd_text())
        return 0
    import yaml

    from krypton.decisions.trust import guard

    if args.release_namespace == "watch" and not args.watch_namespace:
        parser.commands["guard"].error("--release-namespace=watch needs --watch-namespace")
    shared = args.watch_namespace if args.release_namespace == "watch" else None
    sys.stdout.write(yaml.safe_dump_all(guard.manifests(
        args.user, watch_namespace=args.watch_namespace, release_namespace=shared),
        sort_keys=False))
    return 0


def _inherit(args: argparse.Namespace, private: str) -> None:
    """Fill what the user left unset from the running operator's Deployment (SPEC O12), the
    values files it mounts copied into `private`; say on stderr where settings came from.

    Which Deployment (SPEC S2): the one the user names (--from-deployment,
    $KRYPTON_FROM_DEPLOYMENT), else the one labelled by the chart in the namespace the
    user's own settings point to: their --namespace (flag or environment), else the
    namespace of their kube context. Never one found elsewhere: whoever may create a
    Deployment in some other namespace must not choose an administrator's settings. And
    never a setting that widens trust (deployed.WIDENS_TRUST), whichever Deployment it is.
    """
    from pathlib import Path

    from krypton.app.home import context_namespace
    from krypton.cli import fleet
    from krypton.decisions import deployed

    ref = args.from_deployment
    if ref is None:
        ref = os.environ.get("KRYPTON_FROM_DEPLOYMENT", "")
    ref = ref.strip()
    if ref != "none" and ref and not re.fullmatch(r"[a-z0-9.-]+/[a-z0-9.-]+", ref):
        raise SettingsError(f"invalid --from-deployment: {ref!r} is not NAMESPACE/NAME")
    found, where = None, ""
    if ref != "none":
        user = config.load(args, check_helm=False)
        look_in = None
        if not ref:
            namespace = settings_mod.given(settings_mod.option("namespace"), args, os.environ)
            look_in = str(namespace[0]) if namespace else context_namespace(user)
            where = (f" in namespace {look_in} (your --namespace or kube context)"
                     if look_in else " (no --namespace and no namespace in your kube context: "
                     "name it with --from-deployment NAMESPACE/NAME)")
        found, contents = asyncio.run(fleet.find_operator(user, ref, look_in))
    if found is None:
        unset = [o.flag for o in settings_mod.OPTIONS if o.name in CHART_OPTIONS
                 and settings_mod.given(o, args, os.environ) is None]
        if unset and args.command in ("plan", "diff"):
            print(f"krypton {args.command}: no operator Deployment found{where} "
                  f"and no {', '.join(unset)}: using the defaults", file=sys.stderr)
        return
    files = {}
    for i, (path, data) in enumerate(sorted(contents.items())):
        local = Path(private) / f"values-{i}.yaml"
        local.write_bytes(data)
        files[path] = str(local)
    taken = deployed.overlay(args, found, os.environ, files)
    flags = ", ".join(settings_mod.option(name).flag for name in taken) or "nothing"
    print(f"krypton {args.command}: settings of the operator Deployment {found.ref}: took "
          f"{flags} (flags and environment win; --from-deployment none: take nothing)",
          file=sys.stderr)
    if found.refused:
        print(f"krypton {args.command}: not taken from {found.ref}, which widens trust: "
              f"{', '.join(settings_mod.option(name).flag for name in found.refused)} (only your own "
              "flag sets it)", file=sys.stderr)


def _tool(args: argparse.Namespace, settings: settings_mod.Settings) -> int:

    from krypton.app import log
    from krypton.cli import records, register, rollout, view
    from krypton.decisions.errors import KryptonError, PermanentError
    from krypton.decisions.trust.printable import escape, escape_lines

    log.configure("console", "warning")
    try:
        if args.command == "status":
            return _status(args, settings)
        if args.command == "plan":
            from krypton.cli import planning

            rows = asyncio.run(planning.collect_plan(settings))
            print(view.render(rows, view.with_sources(view.PLAN_COLUMNS, rows), args.output))
            return 2 if planning.changes_pending(rows) or planning.blocked(rows) else 0
        if args.command == "diff":
            changed = False
            from krypton.cli import planning

            for heading, text in asyncio.run(planning.collect_diff(settings)):
                changed = changed or bool(text)
                sys.stdout.write(view.diff_section(heading, text))
            return 2 if changed else 0
        if args.command == "rollout":
            import getpass
            import socket

            by = args.by or f"{getpass.getuser()}@{socket.gethostname()}"
            wrote, lines = asyncio.run(rollout.rollout_control(settings, args.action, by))
            print("\n".join(lines))
            return 0 if wrote else 1
        if args.command == "rotate-record-key":
            lines = asyncio.run(records.rotate_record_key(settings, prune=args.prune))
            print("\n".join(escape(line) for line in lines))
            return 0
        if args.command == "retry":
            lines = asyncio.run(records.retry(settings, args.tenant, args.cluster))
            print("\n".join(escape(line) for line in lines))
            return 0
        if args.command == "adopt-records":
            if (args.tenant is None) == (not args.all):
                raise SettingsError("name one Tenant (NAMESPACE/NAME) or --all")
            lines = asyncio.run(records.adopt_records(settings, args.tenant, args.cluster,
                                                    dry_run=args.dry_run))
            print("\n".join(escape(line) for line in lines))
            return 0
        print(escape_lines(asyncio.run(register.register_cluster(
            settings, args.name, args.kubeconfig, args.context, args.values,
            overwrite=args.overwrite))))
        return 0
    except PermanentError as exc:
        print(f"krypton {args.command}: refused: {escape(str(exc))}", file=sys.stderr)
        return 2
    except KryptonError as exc:
        print(f"krypton {args.command}: {escape(str(exc))}", file=sys.stderr)
        return 1


def _status(args: argparse.Namespace, settings: settings_mod.Settings) -> int:
    from krypton.cli import status, view

    if args.watch:
        return _watch(args, settings)
    rows, clusters, rollout = asyncio.run(status.collect_status(settings))
    print(view.render(rows, view.with_sources(view.with_replicas(
        view.WIDE_COLUMNS if args.wide else view.STATUS_COLUMNS, rows), rows), args.output))
    if not clusters:
        print(f"krypton status: no cluster Secrets labelled {settings.kubeconfig_label}=true "
              f"in namespace {settings.namespace!r} of the watch cluster (is that the "
              "operator's --namespace? see --from-deployment)", file=sys.stderr)
    if args.output == "table":
        print("\n" + "\n".join(view.progress(rows, rollout)))
    return 0


def _watch(args: argparse.Namespace, settings: settings_mod.Settings) -> int:
    """A frame per change until Ctrl-C (or SIGTERM): in a terminal, redrawn in place and
    clipped to its width; otherwise each new frame printed after a blank line."""
    import shutil
    import signal
    import time

    from krypton.cli import status, view
    from krypton.decisions.rollouts.rollout import RolloutState

    terminal = sys.stdout.isatty()
    last = [""]

    def show(rows: list[view.Row], rollout: RolloutState | None) -> None:
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        width = shutil.get_terminal_size().columns if terminal else None
        text = view.frame(rows, rollout, wide=args.wide, when=when, width=width)
        body = text.split("\n", 1)[1]
        if terminal:
            sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
        elif body != last[0]:
            sys.stdout.write(text + "\n\n")
        last[0] = body
        sys.stdout.flush()

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(status.watch_status(settings, show))
    return 0
