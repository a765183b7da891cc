"""offtake.redact: credentials out of every URL and connection-string style the worker meets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offtake.redact import MASK, is_secret_key, redact

# (text, the secret that must be gone, what must stay to tell which connection it was)
CASES = [
    ("postgresql://app:s3cr3t@db.prod:5432/orders", "s3cr3t", "postgresql://app:***@db.prod"),
    ("jdbc:postgresql://db/orders?user=app&password=s3cr3t", "s3cr3t", "user=app&password=***"),
    (
        "jdbc:postgresql://db/orders?password=s3cr3t&sslmode=require",
        "s3cr3t",
        "password=***&sslmode=require",
    ),
    (
        "jdbc:sqlserver://db:1433;databaseName=orders;user=app;password=s3cr3t;encrypt=true",
        "s3cr3t",
        "user=app;password=***;encrypt=true",
    ),
    ("jdbc:sqlserver://db;user=app;Password={s3;cr3t};", "cr3t", "Password=***;"),
    ("jdbc:oracle:thin:scott/s3cr3t@db.prod:1521/ORCL", "s3cr3t", "jdbc:oracle:thin:scott/***@db"),
    ("jdbc:oracle:thin:scott/s3cr3t@//db.prod:1521/ORCL", "s3cr3t", "scott/***@//db.prod"),
    ("jdbc:mysql://app:s3cr3t@db:3306/orders", "s3cr3t", "jdbc:mysql://app:***@db:3306"),
    ("jdbc:mysql://db:3306/orders?user=app&password=s3cr3t", "s3cr3t", "password=***"),
    ("jdbc:mariadb://db/orders?passwd=s3cr3t", "s3cr3t", "passwd=***"),
    ("sc://spark.ns.svc:15002/;token=s3cr3t", "s3cr3t", "sc://spark.ns.svc:15002/;token=***"),
    ("sc://spark:15002/;user_id=app;token=s3cr3t;use_ssl=true", "s3cr3t", "user_id=app;token"),
    ("https://user:s3cr3t@registry.example/apis/ccompat/v7", "s3cr3t", "user:***@registry"),
    ("http://:s3cr3t@cache:6379/0", "s3cr3t", "http://:***@cache:6379"),
    ("sqlite:///tmp/catalog.db?pwd=s3cr3t", "s3cr3t", "pwd=***"),
    ("s3://bucket/x?access_key=AKIA1&secret_key=s3cr3t", "s3cr3t", "access_key=***&secret_key"),
    ("s3://bucket/x?X-Amz-Security-Token=s3cr3t&X-Amz-Signature=abc", "s3cr3t", "bucket/x?"),
    ("sasl.password=s3cr3t sasl.username=app", "s3cr3t", "sasl.username=app"),
    ("ssl.keystore.password = s3cr3t", "s3cr3t", "ssl.keystore.password = ***"),
    ("jdbc:db2://db:50000/orders:user=app;password=s3cr3t;", "s3cr3t", "password=***;"),
    (
        "cannot connect to jdbc:postgresql://db/x?password=s3cr3t: FATAL: no pg_hba.conf entry",
        "s3cr3t",
        "FATAL: no pg_hba.conf entry",
    ),
    ("postgresql://app:p@ss@word@db/orders", "ss@word", "postgresql://app:***@db/orders"),
]


@pytest.mark.parametrize(("text", "secret", "kept"), CASES)
def test_every_url_style_loses_its_secret_and_keeps_where_it_points(
    text: str, secret: str, kept: str
) -> None:
    out = redact(text)
    assert secret not in out, out
    assert kept in out, out
    assert MASK in out


@pytest.mark.parametrize(
    "text",
    [
        "jdbc:postgresql://db:5432/orders?user=app&sslmode=require",
        "sc://spark.ns.svc:15002",
        "kafka-0.kafka:9092,kafka-1.kafka:9092",
        "http://registry:8080/apis/ccompat/v7",
        'batch orders-0-0-99: swap into orders failed: column "a=b" does not exist',
        "record orders-3@42: key=b'k7' value={'id': 1}",
        "",
    ],
)
def test_text_without_credentials_is_unchanged(text: str) -> None:
    assert redact(text) == text


def test_secret_key_names() -> None:
    for key in (
        "password",
        "PASSWORD",
        "passwd",
        "pwd",
        "trustStorePassword",
        "token",
        "client_secret",
        "access_key",
        "secretKey",
        "sasl.password",
        "apiKey",
        "sig",
    ):
        assert is_secret_key(key), key
    for key in ("user", "user_id", "sslmode", "databaseName", "key", "currentSchema", "host"):
        assert not is_secret_key(key), key


def test_redacting_twice_changes_nothing_more() -> None:
    for text, _, _ in CASES:
        once = redact(text)
        assert redact(once) == once


# Characters a password may hold that the styles below can carry unencoded.
_PASSWORD = st.text(
    alphabet=st.characters(
        min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="@/;&?#{}\"' ,()"
    ),
    min_size=1,
    max_size=40,
)
_STYLES = [
    "postgresql://app:{pw}@db:5432/orders",
    "jdbc:mysql://app:{pw}@db/orders",
    "jdbc:oracle:thin:app/{pw}@db:1521/svc",
    "jdbc:postgresql://db/orders?user=app&password={pw}&ssl=true",
    "jdbc:sqlserver://db;user=app;password={pw};encrypt=true",
    "jdbc:sqlserver://db;user=app;password={{{pw}}};",
    "sc://spark:15002/;token={pw};use_ssl=true",
    "failed: Connection to jdbc:mysql://db/orders?passwd={pw} refused",
]


@settings(max_examples=300, deadline=None)
@given(pw=_PASSWORD, style=st.sampled_from(_STYLES))
def test_any_password_in_any_style_is_masked(pw: str, style: str) -> None:
    marked = "Q" + pw + "Z"  # Q..Z: so the secret cannot be a piece of the rest by chance
    out = redact(style.format(pw=marked))
    assert marked not in out, out
    assert MASK in out


def test_a_dead_letters_error_message_never_carries_a_urls_password() -> None:
    from offtake.engine.dead_letters import describe_error

    error = ConnectionError("cannot reach postgresql://app:hunter2@db:5432/orders")
    described = describe_error(error)
    assert "hunter2" not in described
    assert described.startswith("ConnectionError: cannot reach postgresql://")
