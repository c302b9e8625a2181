"""D10: what krypton takes of a ClusterProfile and of the admin's providers file. Pure."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from krypton.decisions.clusters import discovery, inventory
from krypton.decisions.clusters.execplugins import Provider
from krypton.decisions.errors import KubeconfigRejected, SettingsError
from krypton.testing import pki

CA = pki.make_ca("profile-ca").cert
FILE = {"providers": [{"name": "token", "execConfig": {
    "apiVersion": "client.authentication.k8s.io/v1", "command": "/opt/plugins/token",
    "args": ["--audience", "fleet"], "env": [{"name": "MODE", "value": "short"}],
    "provideClusterInfo": True}}]}


def profile(*providers: dict[str, Any], key: str = "accessProviders") -> dict[str, Any]:
    return {"metadata": {"name": "eu-1"}, "status": {key: list(providers)}}


def access(name: str = "token", server: str = "https://10.0.0.1:6443", ca: bytes = CA,
           **cluster: Any) -> dict[str, Any]:
    return {"name": name, "cluster": {"server": server,
                                      "certificate-authority-data": base64.b64encode(ca).decode(),
                                      **cluster}}


def test_the_providers_file_in_kep_5339s_shape() -> None:
    providers = inventory.parse_providers(FILE, "providers.json")
    assert providers == {"token": Provider("token", "/opt/plugins/token", ("--audience", "fleet"),
                                           (("MODE", "short"),), True)}


@pytest.mark.parametrize(("doc", "problem"), [
    ([], "expected"),
    ({"providers": [{"name": "x"}]}, "name and execConfig are required"),
    ({"providers": [{"name": "x", "execConfig": {"apiVersion": "v1beta1", "command": "c"}}]},
     "apiVersion must be"),
    ({"providers": [{"name": "x", "execConfig": {"command": ""}}]}, "command is required"),
    ({"providers": [{"name": "x", "execConfig": {"command": "c", "args": [1]}}]}, "args"),
    ({"providers": [{"name": "x", "execConfig": {"command": "c", "env": [{"name": "A"}]}}]},
     "name/value pairs"),
    ({"providers": [FILE["providers"][0]] * 2}, "a second provider"),
])
def test_a_bad_providers_file_is_a_settings_error(doc: Any, problem: str) -> None:
    with pytest.raises(SettingsError, match="providers.json") as caught:
        inventory.parse_providers(doc, "providers.json")
    assert problem in str(caught.value)


def test_a_profile_gives_its_server_and_ca_and_nothing_else() -> None:
    providers = inventory.parse_providers(FILE, "f")
    # a profile's proxy, TLS override and exec extensions are not believed
    found = inventory.profile_access(profile(access(
        **{"proxy-url": "http://evil:3128", "insecure-skip-tls-verify": True,
           "tls-server-name": "other", "extensions": [{"name": "client.authentication.k8s.io/exec",
                                                        "extension": {"command": "/bin/sh"}}]})),
        providers)
    assert found == inventory.PluginAccess("https://10.0.0.1:6443", CA, providers["token"])
    # the first provider the admin's file names; accessProviders before credentialProviders
    two = profile(access("other"), access("token", server="https://b:6443"))
    assert inventory.profile_access(two, providers).server == "https://b:6443"
    old = {"status": {"credentialProviders": [access(server="https://old:6443")],
                      "accessProviders": [access(server="https://new:6443")]}}
    assert inventory.profile_access(old, providers).server == "https://new:6443"


@pytest.mark.parametrize(("prof", "reason", "words"), [
    (profile(access("other")), "CredentialProviderUnknown", "(other) is in the providers file"),
    ({"status": None}, "ClusterProfilePending", "no access provider yet"),
    (profile(access(server="http://plain:80")), "ClusterProfileInvalid", "https://"),
    (profile(access(ca=b"not a certificate")), "ClusterProfileInvalid", "PEM"),
    (profile(access(server="https://h:6443/prefix")), "ClusterProfileInvalid", "path"),
    (profile(access(server="https://user:pw@h:6443")), "ClusterProfileInvalid", "user info"),
    (profile(access(ca=CA * (inventory.MAX_CA // len(CA) + 1))), "ClusterProfileInvalid",
     "at most"),
    ({"status": {"accessProviders": 5}}, "ClusterProfilePending", "no access provider"),
    ({"status": {"accessProviders": [{"name": {"a": 1}}, "x"]}}, "ClusterProfilePending",
     "no access provider"),
])
def test_a_profile_krypton_cannot_use_says_why(prof: dict[str, Any], reason: str,
                                              words: str) -> None:
    with pytest.raises(KubeconfigRejected) as caught:
        inventory.profile_access(prof, inventory.parse_providers(FILE, "f"))
    assert caught.value.reason == reason and words in str(caught.value)


def named(name: str, *providers: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "fleet", "uid": f"u-{name}", **meta},
            "status": {"accessProviders": list(providers),
                       "conditions": [{"type": "ControlPlaneHealthy", "status": "True"}]}}


def test_a_profile_is_a_cluster_of_its_name_changed_only_by_its_access() -> None:
    first = discovery.desired_profiles([named("eu-1", access())])["eu-1"]
    assert (first.source, first.namespace, first.kubeconfig) == ("ClusterProfile", "fleet", None)
    assert first.involved == {"apiVersion": "multicluster.x-k8s.io/v1alpha1",
                              "kind": "ClusterProfile", "name": "eu-1", "namespace": "fleet",
                              "uid": "u-eu-1"}
    sick = named("eu-1", access())
    sick["status"]["conditions"][0]["status"] = "False"  # a condition: not how it is reached
    assert discovery.desired_profiles([sick])["eu-1"].digest == first.digest
    moved = discovery.desired_profiles([named("eu-1", access(server="https://10.0.0.2"))])
    assert moved["eu-1"].digest != first.digest
    going = named("eu-1", access(), deletionTimestamp="2026-11-27T10:00:00Z")
    assert discovery.desired_profiles([going]) == {}
    huge = named("eu-1", access(name="x" * discovery.MAX_PROFILE_ACCESS))
    assert discovery.desired_profiles([huge])["eu-1"].profile == {"status": {}}  # none taken
    # what the fleet engages it with: the access the admin's providers name
    providers = inventory.parse_providers(FILE, "f")
    assert inventory.profile_access(first.profile or {}, providers) == inventory.PluginAccess(
        "https://10.0.0.1:6443", CA, providers["token"])


def test_a_profile_with_a_secrets_name_clashes_and_the_secret_stays() -> None:
    secret = {"metadata": {"name": "eu-1", "namespace": "fleet", "uid": "s"},
              "data": {"kubeconfig": "eA=="}}
    secrets = discovery.desired_clusters([secret], "kubeconfig")
    profiles = discovery.desired_profiles([named("eu-1", access()), named("eu-2", access())])
    wanted, clashes = discovery.combined(secrets, profiles)
    assert wanted["eu-1"].source == "Secret" and wanted["eu-2"].source == "ClusterProfile"
    assert [c.name for c in clashes] == ["eu-1"] and clashes[0].source == "ClusterProfile"


def test_krypton_keeps_of_a_profile_its_metadata_and_access_only() -> None:
    kept = discovery.profile_fields({**named("eu-1", access(), managedFields=[{"x": 1}]),
                                     "spec": {"displayName": "x" * 1000}})
    assert kept == {"metadata": {"name": "eu-1", "namespace": "fleet", "uid": "u-eu-1"},
                    "status": {"accessProviders": [access()]}}
