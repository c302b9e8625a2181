"""Where the fleet's clusters are found (D1, D10): the labelled kubeconfig Secrets of
--namespace and, with --cluster-profiles, the ClusterProfiles of
--cluster-profile-namespace, each kept by an informer of the watch cluster. What is wrong
with one of them before any cluster is tried (a label value that is not "true", a profile
with a Secret's name) is said once, on it: a Warning Event and a log line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from krypton.adapters.events import EventRecorder, involved_secret
from krypton.adapters.informer import Informer
from krypton.adapters.kube import Kube
from krypton.adapters.kubeapi import core_path, profiles_path
from krypton.decisions.clusters.discovery import (
    LABEL_VALUE,
    ClusterSpec,
    by_label,
    combined,
    desired_clusters,
    desired_profiles,
    profile_fields,
)
from krypton.decisions.settings import Settings

log = structlog.get_logger("krypton")


class Discovery:
    def __init__(self, home: Kube, settings: Settings, events: EventRecorder,
                 changed: Callable[[], None]) -> None:
        self.settings, self.events = settings, events
        self.secrets = Informer(
            home, "kubeconfig-secrets", core_path("secrets", settings.namespace),
            lambda _t, _o: changed(),
            label_selector=settings.kubeconfig_label,  # any value: a wrong one is reported
            on_error=lambda exc: log.warning("discovery watch failed", error=str(exc)))
        self.profiles: Informer | None = None
        if settings.cluster_profiles:
            self.profiles = Informer(
                home, "cluster-profiles",
                profiles_path(settings.cluster_profile_namespace or settings.namespace),
                lambda _t, _o: changed(),
                label_selector=settings.cluster_profile_selector or None,
                transform=profile_fields, on_error=self._profiles_failed)
        self._said: dict[str, str] = {}  # object UID -> what was said of it
        self._names: frozenset[str] | None = None
        self._profiles_problem = ""  # why the ClusterProfiles are not listed (their CRD, RBAC)

    def start(self) -> Discovery:
        self.secrets.start()
        if self.profiles is not None:
            self.profiles.start()
        return self

    async def stop(self) -> None:
        await self.secrets.stop()
        if self.profiles is not None:
            await self.profiles.stop()

    def _profiles_failed(self, exc: Exception) -> None:
        self._profiles_problem = str(exc)
        log.warning("ClusterProfile watch failed", error=str(exc))

    def details(self) -> list[str]:
        """What keeps discovery from knowing the whole fleet, for /readyz."""
        if self.profiles is None or self.profiles.synced.is_set():
            return []
        return [f"ClusterProfiles not listed yet: {self._profiles_problem or 'listing'}"]

    def synced(self) -> bool:
        """Every source listed once (until then the fleet is not known whole)."""
        return self.secrets.synced.is_set() and (
            self.profiles is None or self.profiles.synced.is_set())

    def names(self) -> frozenset[str] | None:
        """Every discovered cluster's name, as :meth:`desired` last sorted them; None until
        every source was listed. One set shared by every caller until the names change, not
        a copy each: every worker keeps the last one it looked at, and a copy per worker grew
        with the square of the fleet (64 MiB at 1000 clusters)."""
        if self._names is None and self.synced():
            self._names = frozenset(self._specs()[0])
        return self._names

    def _specs(self) -> tuple[dict[str, ClusterSpec], list[ClusterSpec], list[Any],
                              list[tuple[dict[str, Any], str]]]:
        """The clusters wanted, the profiles that clash with a Secret, the objects they were
        found as, and the Secrets labelled with a value that is not "true"."""
        accepted, ignored = by_label(list(self.secrets.store.values()),
                                     self.settings.kubeconfig_label)
        profiles = list(self.profiles.store.values()) if self.profiles is not None else []
        specs, clashes = combined(desired_clusters(accepted, self.settings.kubeconfig_key),
                                  desired_profiles(profiles))
        return specs, clashes, profiles + accepted, ignored  # a Secret's pin before a profile's

    async def desired(self) -> tuple[dict[str, ClusterSpec], list[dict[str, Any]]]:
        """The clusters wanted now, and the objects they were found as (their labels pin
        them to a replica under --sharding)."""
        specs, clashes, objects, ignored = self._specs()
        label = self.settings.kubeconfig_label
        said: dict[str, str] = {}
        for secret, value in ignored:
            meta = secret["metadata"]
            await self._say(said, str(meta.get("uid")), value, "cluster Secret ignored",
                            involved_secret(meta.get("namespace", ""), meta["name"],
                                            meta.get("uid")), "KubeconfigLabelIgnored",
                            f"label {label}={value!r} is not {LABEL_VALUE!r}: this Secret is "
                            f"not a cluster of the fleet (set the label to exactly "
                            f"{LABEL_VALUE})")
        for spec in clashes:
            await self._say(said, spec.uid, "clash", "ClusterProfile not engaged",
                            spec.involved, "ClusterNameClash",
                            f"cluster Secret {spec.name} in {self.settings.namespace} has this "
                            "name: its cluster is the one engaged, this profile is not (rename "
                            "or remove one)")
        self._said = said
        names = frozenset(specs)
        if names != self._names:
            self._names = names
        return specs, objects

    async def _say(self, said: dict[str, str], uid: str, what: str, line: str,
                   involved: Any, reason: str, message: str) -> None:
        """Warn of an object once per `what` (while it stays so)."""
        said[uid] = what
        if self._said.get(uid) == what:
            return
        log.warning(line, name=involved.get("name"), reason=reason, detail=message)
        await self.events.emit(involved, "Warning", reason, message)
