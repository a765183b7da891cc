"""What reaches kopf's admission machinery: only what the API server would send this webhook.

kopf's webhook server answers any caller that reaches its port, parses any JSON body and keeps a
memo per object uid for every operation but CREATE (kopf's ``recall_memo``, never forgotten for
an object that is never created), so an in-cluster client could probe pipelines, images and
Secret names through the webhook's answers or grow the operator's memory without bound.
:class:`GuardedWebhookServer` stands in front of it:

- the caller's TLS client certificate is verified against ``client_ca_file`` when one is
  configured (the API server presents one when the cluster's AdmissionConfiguration gives it a
  kubeconfig for webhooks); without one, the chart's NetworkPolicy is what keeps other pods
  away (docs/operator.md);
- a request for another path gets 404, a body over :data:`MAX_REVIEW_BYTES` 413, a body that
  is not JSON 415/400, and anything but a ``admission.k8s.io/v1`` AdmissionReview of a Pod
  CREATE (the only thing the webhook configuration asks for) 400, naming what is wrong, before
  kopf parses a byte; CREATE memos are ephemeral in kopf, so nothing accumulates.
"""

from __future__ import annotations

import json
import logging
import ssl
from typing import Any

import aiohttp.web
import kopf

log = logging.getLogger("offtake.operator.webhook")

#: A Pod's AdmissionReview is a few KiB; aiohttp's own default cap is 1 MiB too.
MAX_REVIEW_BYTES = 1024 * 1024

POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}


def review_problem(data: Any) -> str | None:
    """Why ``data`` is not an AdmissionReview this webhook handles, or None if it is one."""
    if not isinstance(data, dict):
        return "the body is not a JSON object"
    if data.get("apiVersion") != "admission.k8s.io/v1" or data.get("kind") != "AdmissionReview":
        return "apiVersion/kind: not an admission.k8s.io/v1 AdmissionReview"
    request = data.get("request")
    if not isinstance(request, dict):
        return "request: missing"
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > 128:
        return "request.uid: missing or not a short string"
    if request.get("kind") != POD_KIND:
        return f"request.kind: {request.get('kind')!r} is not a v1 Pod"
    resource = request.get("resource")
    if not isinstance(resource, dict) or resource.get("resource") != "pods":
        return "request.resource: not pods"
    if request.get("subResource"):
        return f"request.subResource: {request.get('subResource')!r} is not handled"
    if request.get("operation") != "CREATE":
        return f"request.operation: {request.get('operation')!r} is not handled (CREATE only)"
    if not isinstance(request.get("object"), dict):
        return "request.object: missing"
    if not isinstance(request.get("userInfo"), dict):
        return "request.userInfo: missing"
    return None


class GuardedWebhookServer(kopf.WebhookServer):
    """kopf's WebhookServer with the checks above in front of kopf's own handling."""

    def __init__(self, *, webhook_id: str, client_ca_file: str = "", **kwargs: Any) -> None:
        if client_ca_file:
            kwargs.update(verify_cafile=client_ca_file, verify_mode=ssl.CERT_REQUIRED)
        super().__init__(**kwargs)
        self.webhook_id = webhook_id

    async def _serve(  # type: ignore[override]
        self, fn: Any, request: aiohttp.web.Request
    ) -> aiohttp.web.Response:
        refused = await self._refusal(request)
        if refused is not None:
            log.warning(
                "refused a webhook request from %s to %s: %s",
                request.remote,
                request.path,
                refused.text,
            )
            return refused
        response: aiohttp.web.Response = await kopf.WebhookServer._serve(fn, request)
        return response

    async def _refusal(self, request: aiohttp.web.Request) -> aiohttp.web.Response | None:
        def answer(status: int, why: str) -> aiohttp.web.Response:
            return aiohttp.web.Response(status=status, text=why, content_type="text/plain")

        if request.match_info.get("id") != self.webhook_id:
            return answer(404, f"not found: this webhook serves /{self.webhook_id} only")
        length = request.content_length
        if length is None or length > MAX_REVIEW_BYTES:
            return answer(413, f"the body must have a Content-Length of at most {MAX_REVIEW_BYTES}")
        if request.content_type != "application/json":
            return answer(415, f"Content-Type {request.content_type!r}: application/json only")
        # Read here (aiohttp keeps it for kopf's request.text()), bounded by the length above.
        body = await request.read()
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            return answer(400, f"the body is not JSON: {exc}")
        problem = review_problem(data)
        return None if problem is None else answer(400, problem)
