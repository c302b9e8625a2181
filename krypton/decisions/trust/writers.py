"""Who writes krypton's releases (SPEC S6). Pure.

Every helm run of krypton labels the release record it makes with the name of the krypton
instance that ran it (``mesh.openkcm.io/writer``). A second instance on the same fleet (one
started by hand beside the chart's, two installations sharing a release namespace) would
otherwise undo every change of the first as drift, and the first every change of the
second, without end. So a helm run that would change a release whose newest record another
instance wrote is not started while that instance is at work: the release is left alone
and the other writer named (reason ``AnotherWriter``).

An instance that elects a leader (or shards) is named after its installation's Lease,
``lease.<namespace>.<name>``: its replicas are one writer, and the Lease says whether it is
at work. An instance without the fleet's Lease keeps a Lease of its own while it runs (its
*presence*, :func:`presence_lease`), renewed and deleted when it stops, and is named after
it the same way: another instance leaves its releases alone exactly while it runs. Where
that Lease cannot be made (no rights), it is named after its process, ``run.<host>.<pid>``,
and taken to be at work when it wrote the record after this process started (an instance
that stopped before this one started, such as this one's own predecessor, is not) and less
than `WINDOW_RESYNCS` resync periods ago, so two such instances take turns at most once in
that time each.

A person's ``helm upgrade`` keeps the labels of the record before it (helm merges them), so
it carries krypton's own name: it is drift, repaired at most `REPAIRS_MAX` times an hour.
Each repair labels its record with a token of its own, so a copy of its labels in a later
record is not counted again.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from krypton.decisions.model import RELEASE_REPAIR_LABEL, epoch_seconds

LABEL_MAX = 63
LEASE_PREFIX = "lease."
RUN_PREFIX = "run."
PRESENCE_PREFIX = "krypton-run-"
PRESENCE_LABEL = "mesh.openkcm.io/presence"  # on the presence Leases, for their cleanup
PRESENCE_HOST = "mesh.openkcm.io/host"  # annotations of a presence Lease: whose it is
PRESENCE_PID = "mesh.openkcm.io/pid"
PRESENCE_STALE = 3600.0  # seconds unrenewed after which a presence Lease is a leftover
WINDOW_RESYNCS = 3  # resync periods another writer without a Lease is believed at work
REPAIRS_MAX = 3  # drift repairs of one release in REPAIRS_PER seconds before the brake
REPAIRS_PER = 3600.0


def label_value(text: str) -> str:
    """`text` as a label value (at most 63 of [A-Za-z0-9_.-], alphanumeric at both ends);
    a longer one is cut and ends in a digest of the whole."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "-", text).strip("-_.") or "krypton"
    if len(clean) <= LABEL_MAX:
        return clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{clean[:LABEL_MAX - 9].rstrip('-_.')}-{digest}"


def name(*, leased: bool, lease_namespace: str, lease_name: str, host: str, pid: int) -> str:
    """This krypton instance's name on the records it writes."""
    if leased:
        return label_value(f"{LEASE_PREFIX}{lease_namespace}.{lease_name}")
    return label_value(f"{RUN_PREFIX}{host}.{pid}")


def presence_lease(namespace: str, host: str, pid: int) -> str:
    """The name of the Lease in `namespace` an instance without the fleet's Lease keeps
    while it runs: a DNS-1123 name, its host cut so that the writer name made of it fits a
    label (below its bound: a name at the bound may have been cut)."""
    room = LABEL_MAX - 1 - len(f"{LEASE_PREFIX}{namespace}.{PRESENCE_PREFIX}-{pid}")
    clean = re.sub(r"[^a-z0-9-]", "-", host.lower())[:max(room, 0)].strip("-")
    return f"{PRESENCE_PREFIX}{clean}-{pid}" if clean else f"{PRESENCE_PREFIX}{pid}"


def lease_of(writer: str) -> tuple[str, str] | None:
    """The (namespace, name) of the Lease a writer's name says it holds; None for a writer
    without one (or whose name was cut: its Lease cannot be told)."""
    if not writer.startswith(LEASE_PREFIX):
        return None
    namespace, _, lease = writer[len(LEASE_PREFIX):].partition(".")
    if not namespace or not lease or len(writer) == LABEL_MAX:
        return None
    return namespace, lease


def active_without_lease(written: float, started: float, now: float,
                         resync_period: float) -> float:
    """For how many seconds more a writer without a Lease is taken to be at work (0: it is
    not): it wrote after this process `started`, for WINDOW_RESYNCS resync periods from
    then."""
    if written <= started:
        return 0.0
    return max(0.0, WINDOW_RESYNCS * resync_period - (now - written))


NOT_A_REPAIR = "no"  # the repair label of a record no drift repair made


def repair_token(now: float) -> str:
    """The repair label of the record a drift repair makes: a value of its own (helm
    copies a record's labels into the records a person's upgrade or rollback makes after
    it, and a copy is no repair)."""
    return f"r{int(now * 1000):x}"


def repairs(records: Iterable[Mapping[str, Any]], now: float) -> int:
    """How many drift repairs made a record of a release (of its `records`' metadata) less
    than REPAIRS_PER seconds before `now`: each repair counted once, at its first record."""
    first: dict[str, float] = {}
    for record in records:
        meta = record.get("metadata") or {}
        token = str((meta.get("labels") or {}).get(RELEASE_REPAIR_LABEL) or NOT_A_REPAIR)
        if token != NOT_A_REPAIR:
            made = epoch_seconds(meta.get("creationTimestamp")) or 0.0
            first[token] = min(first.get(token, made), made)
    return sum(now - made < REPAIRS_PER for made in first.values())
