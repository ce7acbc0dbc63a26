"""A stand-in for the Kubernetes API server, speaking only the Deployment scale subresource.

No API server runs here, so the Kubernetes actuator is tested against this small HTTP server
(port 0, a thread) that implements GET and PATCH (JSON merge patch) on
/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale the way the real one answers, and
records every request it received so tests can assert the exact calls and bodies.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

SCALE_PATH = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)/scale$")


@dataclass(frozen=True)
class ReceivedRequest:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    authorization: str | None
    body: Any  # parsed JSON, or None for a request without a body


@dataclass
class ScaleApiStandIn:
    """Deployments' replica counts by (namespace, name); `forbidden` names answer 403."""

    replicas: dict[tuple[str, str], int] = field(default_factory=dict)
    forbidden: set[str] = field(default_factory=set)
    received: list[ReceivedRequest] = field(default_factory=list)
    url: str = ""

    def scale_object(self, namespace: str, name: str) -> dict[str, Any]:
        replicas = self.replicas[(namespace, name)]
        spec = {"replicas": replicas} if replicas else {}  # the API server omits 0
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": spec,
            "status": {"replicas": replicas, "selector": f"app.kubernetes.io/component={name}"},
        }


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _handler_for(api: ScaleApiStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            return None

        def do_GET(self) -> None:
            self._handle(None)

        def do_PATCH(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            self._handle(json.loads(self.rfile.read(length)))

        def _handle(self, body: Any) -> None:
            parts = urlsplit(self.path)
            api.received.append(ReceivedRequest(
                method=self.command, path=parts.path, query=dict(parse_qsl(parts.query)),
                content_type=self.headers.get("Content-Type"),
                authorization=self.headers.get("Authorization"), body=body,
            ))
            code, answer = self._answer(parts.path, body)
            payload = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _answer(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
            match = SCALE_PATH.match(path)
            if not match:
                return 404, _status(404, "NotFound", f"the stand-in serves only scale, not {path}")
            namespace, name = match.groups()
            if name in api.forbidden:
                return 403, _status(403, "Forbidden", f"deployments.apps \"{name}\" is forbidden")
            if (namespace, name) not in api.replicas:
                return 404, _status(404, "NotFound", f"deployments.apps \"{name}\" not found")
            if body is not None:
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    return 415, _status(415, "UnsupportedMediaType", "expected a merge patch")
                api.replicas[(namespace, name)] = int(body["spec"]["replicas"])
            return 200, api.scale_object(namespace, name)

    return Handler


@pytest.fixture
def scale_api() -> Iterator[ScaleApiStandIn]:
    """The stand-in API server with pdserve-prefill=2 and pdserve-decode=3 in namespace pdserve."""
    api = ScaleApiStandIn(replicas={("pdserve", "pdserve-prefill"): 2, ("pdserve", "pdserve-decode"): 3})
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(api))
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), name="scale-api-standin", daemon=True)
    thread.start()
    yield api
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
