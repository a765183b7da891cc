"""What a pipeline's status and Event say when the API server refuses one of its children.

The message names the child's kind and name, the answer's status and reason, and what the
server refused: each of its ``details.causes`` as ``field: message`` (server-side apply's 500
for a body it cannot type, such as two env entries of one name, carries its field paths in the
message instead: they are read from there). It is one line and at most :data:`MESSAGE_LIMIT`
characters whatever the server said (an admission webhook's denial can be any size). A Secret
child's values never appear in it: for a Secret only the causes' fields and reasons are shown
(the server's own text may quote a value, cut anywhere by the bounds above), and every value the
rendering holds is replaced by :data:`REDACTED` in whatever is left.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .kubeapi import TYPED_PATCH_REFUSED, ApiError, Cause

#: The whole message's bound (the Event's message is cut at the same length).
MESSAGE_LIMIT = 1000
#: Causes shown; the rest are counted ("and 3 more").
CAUSES_SHOWN = 8
REDACTED = "<redacted>"
#: Values shorter than this are not searched for (every "a" in the message would go); a
#: Secret's message holds no text of the server's that could quote one anyway.
_SHORTEST_HIDDEN = 4

_SPACE = re.compile(r"\s+")


def refusal_message(
    kind: str, name: str, exc: ApiError, hidden: Sequence[str] = (), secret: bool = False
) -> str:
    """The one-line message for ``kind`` ``name`` that the API server refused with ``exc``.
    ``hidden``: values to remove from what the server said (the child's Secret values);
    ``secret``: the child is a Secret: of the causes only their fields and reasons."""
    causes = list(exc.causes) or typed_patch_causes(exc.message)
    if causes:
        shown = [_cause(c, secret) for c in causes]
        detail = "; ".join(shown[:CAUSES_SHOWN])
        if len(shown) > CAUSES_SHOWN:
            detail += f"; and {len(shown) - CAUSES_SHOWN} more"
        head = _head(exc.message)
        if head:
            detail = f"{head}: {detail}"
    elif secret:
        detail = _head(exc.message) or "the server's message is not shown for a Secret"
    else:
        detail = exc.message or "(no message)"
    text = f"{kind} {name} was rejected by the API server ({exc.status} {exc.reason}): {detail}"
    return _bounded(_redacted(text, hidden))


def _cause(cause: Cause, secret: bool) -> str:
    said = (cause.reason or "refused") if secret else cause.message
    return f"{cause.field}: {said}" if cause.field else said


def typed_patch_causes(message: str) -> list[Cause]:
    """The field paths and errors of server-side apply's typed-patch refusal, e.g.
    ``failed to create typed patch object (ns/x; apps/v1, Kind=Deployment): errors:\\n
    .spec.template.spec.containers[name="worker"].env: duplicate entries for key [name="X"]``
    (one error comes without ``errors:``)."""
    if not message.startswith(TYPED_PATCH_REFUSED):
        return []
    _, _, rest = message.partition("): ")
    rest = rest.removeprefix("errors:")
    causes = []
    for line in rest.splitlines():
        line = line.strip()
        if not line:
            continue
        split = _unquoted_colon(line)
        if split < 0:
            causes.append(Cause("", line))
        else:
            causes.append(Cause(line[:split].lstrip("."), line[split + 2 :]))
    return causes


def secret_values(obj: Mapping[str, Any]) -> list[str]:
    """The values a rendered Secret holds, as sent (``data``: base64) and as read."""
    values: list[str] = []
    for value in (obj.get("stringData") or {}).values():
        values.append(str(value))
    for value in (obj.get("data") or {}).values():
        values.append(str(value))
        with contextlib.suppress(binascii.Error, UnicodeDecodeError):  # not text: as sent
            values.append(base64.b64decode(str(value), validate=True).decode())
    return values


def _head(message: str) -> str:
    """The message's first clause when it says who refused beyond the causes (``admission
    webhook "x" denied the request``); not the server's own ``Kind "x" is invalid``."""
    head = message.split(": ", 1)[0] if ": " in message else ""
    if head.endswith(" is invalid") or head.startswith(TYPED_PATCH_REFUSED):
        return ""
    return head


def _unquoted_colon(line: str) -> int:
    """Where ``": "`` first occurs outside double quotes (a key's value may hold one), or -1."""
    quoted = escaped = False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif not quoted and line.startswith(": ", i):
            return i
    return -1


def _redacted(text: str, hidden: Iterable[str]) -> str:
    # Longest first: a value inside another value is then replaced with it.
    for value in sorted({v for v in hidden if len(v) >= _SHORTEST_HIDDEN}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def _bounded(text: str) -> str:
    """One line (control characters and runs of white space become one space), capped."""
    text = _SPACE.sub(" ", "".join(ch if ch.isprintable() else " " for ch in text)).strip()
    if len(text) > MESSAGE_LIMIT:
        text = text[: MESSAGE_LIMIT - 1] + "…"
    return text
