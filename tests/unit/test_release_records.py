"""Helm's release record format, decoded without helm (decisions/releases.decode_release).
The encoding is helm's storage format: base64 of gzip of the release JSON, base64-encoded
once more by the Secret driver (the Kubernetes data encoding)."""

from __future__ import annotations

import base64
import gzip
import json

import pytest

from krypton.decisions.releases import RELEASE_MAX_BYTES, decode_release

RELEASE = {"name": "tenant-a-c1", "version": 2, "manifest": "---\nkind: ConfigMap\n"}


def _stored(payload: bytes, driver: str) -> dict[str, object]:
    text = base64.b64encode(payload).decode()
    if driver == "secret":
        text = base64.b64encode(text.encode()).decode()
    return {"data": {"release": text}}


@pytest.mark.parametrize("driver", ["configmap", "secret"])
@pytest.mark.parametrize("zipped", [True, False])
def test_a_record_decodes_to_the_release(driver: str, zipped: bool) -> None:
    raw = json.dumps(RELEASE).encode()
    assert decode_release(_stored(gzip.compress(raw) if zipped else raw, driver), driver) == \
        RELEASE


@pytest.mark.parametrize("record", [
    {}, {"data": {}}, {"data": {"release": 7}},
    _stored(b"not json", "configmap"), _stored(b"[1, 2]", "configmap"),
])
def test_what_is_not_a_release_is_a_value_error(record: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        decode_release(record, "configmap")


def test_a_gzip_bomb_is_bounded() -> None:
    bomb = gzip.compress(b"{" + b" " * (RELEASE_MAX_BYTES + 10) + b"}")
    with pytest.raises(ValueError, match="size limit"):
        decode_release(_stored(bomb, "configmap"), "configmap")
