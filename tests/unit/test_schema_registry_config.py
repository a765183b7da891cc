"""The schema registry client's settings from a mounted Secret: basic auth and TLS files."""

from __future__ import annotations

from pathlib import Path

import pytest

from offtake.config.spec import SchemaRegistrySpec, SecretRef
from offtake.schema_registry import make_client, registry_config
from offtake_testbed._pki import CertificateAuthority


def test_basic_auth_and_tls_come_from_the_secret_folder(tmp_path: Path) -> None:
    folder = tmp_path / "sr-creds"
    folder.mkdir()
    ca = CertificateAuthority()  # real PEM files: the client loads them when it is made
    client = ca.client("orders-worker")
    for name, text in {
        "username": "svc-orders\n",
        "password": "s3cret\n",
        "ca.crt": ca.cert_pem,
        "tls.crt": client.cert_pem,
        "tls.key": client.key_pem,
    }.items():
        (folder / name).write_text(text)
    spec = SchemaRegistrySpec("https://registry:8081", SecretRef("sr-creds"))
    conf = registry_config(spec, str(tmp_path))
    assert conf["url"] == "https://registry:8081"
    assert conf["basic.auth.user.info"] == "svc-orders:s3cret"
    assert conf["ssl.ca.location"] == str(folder / "ca.crt")
    assert conf["ssl.certificate.location"] == str(folder / "tls.crt")
    assert conf["ssl.key.location"] == str(folder / "tls.key")
    make_client(spec, str(tmp_path))  # confluent-kafka's client accepts the settings


def test_a_secret_that_is_not_mounted_is_named(tmp_path: Path) -> None:
    spec = SchemaRegistrySpec("http://registry:8081", SecretRef("missing"))
    with pytest.raises(ValueError, match="'missing': no mounted Secret at"):
        registry_config(spec, str(tmp_path))
    assert registry_config(SchemaRegistrySpec("http://r:1"), str(tmp_path)) == {
        "url": "http://r:1",
        "max.retries": 0,
        "timeout": 10,
    }
