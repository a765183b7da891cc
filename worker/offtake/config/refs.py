"""The manifest's references to Secrets, and URLs that must not carry a credential inline:
shared by the loader's sections (kafka, the schema registry, the Spark sink)."""

from __future__ import annotations

from offtake.config._fields import ConfigError, Fields
from offtake.config.client_properties import has_url_credentials
from offtake.config.spec import SecretKeyRef, SecretRef


def secret_ref(f: Fields | None) -> SecretRef | None:
    if f is None:
        return None
    return f.finish(SecretRef(name=f.text("name")))


def secret_key_ref(f: Fields | None) -> SecretKeyRef | None:
    if f is None:
        return None
    return f.finish(SecretKeyRef(name=f.text("name"), key=f.text("key")))


def no_url_credentials(f: Fields, key: str, url: str | None, instead: str) -> None:
    """Refuse a URL that carries a password or token inline, without echoing the URL."""
    if url is not None and has_url_credentials(url):
        raise ConfigError(
            f.at(key),
            "carries a password or token inline (it would be stored in plain text in the "
            f"pipeline and its ConfigMap): remove it from the URL and name a Secret in {instead}",
        )
