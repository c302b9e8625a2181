"""The tests' own exec credential plugin (client.authentication.k8s.io/v1): a real
ServiceAccount token of a cluster (TokenRequest), said to expire after CLAIMED seconds.

The token is bound to a Secret made for it, and the Secrets of tokens older than
2 x CLAIMED seconds are deleted, which ends those tokens at once (the API server checks a
bound token's object on every request): a client that kept a token past its claimed
expiry fails within seconds, so rotation is exercised for real. Each run appends the
server it was told (KUBERNETES_EXEC_INFO) to RUNS.

Environment: ADMIN (an admin kubeconfig of the cluster), NAMESPACE, ACCOUNT (the
ServiceAccount), CLAIMED (seconds), RUNS (a file).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time

from kubernetes import client, config

PREFIX = "token-"


def main() -> None:
    env = os.environ
    told = json.loads(env.get("KUBERNETES_EXEC_INFO") or "{}")
    with open(env["RUNS"], "a") as runs:
        runs.write(((told.get("spec") or {}).get("cluster") or {}).get("server", "-") + "\n")
    api = config.new_client_from_config(config_file=env["ADMIN"])
    core, namespace, claimed = client.CoreV1Api(api), env["NAMESPACE"], int(env["CLAIMED"])
    now = time.time()
    secret = core.create_namespaced_secret(namespace, {"metadata": {
        "name": f"{PREFIX}{int(now * 1000)}", "labels": {"purpose": "bound-token"}}})
    answer = core.create_namespaced_service_account_token(env["ACCOUNT"], namespace, {
        "spec": {"expirationSeconds": 600, "boundObjectRef": {
            "kind": "Secret", "apiVersion": "v1", "name": secret.metadata.name,
            "uid": secret.metadata.uid}}})
    for old in core.list_namespaced_secret(namespace, label_selector="purpose=bound-token").items:
        if int(old.metadata.name.removeprefix(PREFIX)) / 1000 < now - 2 * claimed:
            core.delete_namespaced_secret(old.metadata.name, namespace)
    expiry = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=claimed)
    print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                      "status": {"token": answer.status.token,
                                 "expirationTimestamp": expiry.strftime("%Y-%m-%dT%H:%M:%SZ")}}))


if __name__ == "__main__":
    main()
