"""spec.redrive's unknown keys are named like every other field: quoted when not plain (a key
with a control character or a space, or not a string at all), never printed raw."""

from __future__ import annotations

import pytest

from offtake.config import ConfigError
from offtake.config.redrive import parse_redrive


@pytest.mark.parametrize(
    ("key", "path"),
    [("\x1b", "spec.redrive.'\\x1b'"), (" ", "spec.redrive.' '"), (7, "spec.redrive.7")],
)
def test_an_unknown_redrive_key_is_named_quoted(key: object, path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_redrive({"id": "r1", "from": "2024-01-01T00:00:00Z", key: 1}, "dlq")
    assert str(caught.value).startswith(path)
    assert str(caught.value).isprintable()
