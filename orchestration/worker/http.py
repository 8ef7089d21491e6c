"""The worker's HTTP endpoint, on daemon threads, for the control plane only (its shared token,
``SHOTLOOM_WORKER_TOKEN``, when one is set; without one the worker binds loopback only):

    GET  /status                 device, boot id, current run, weights, resource snapshot, admission plan
    POST /runs {run_id, resume}  accept a run if idle (202) or refuse (409)
    POST /runs/<id>/terminate    interrupt that run; the process and its weights survive
"""

from __future__ import annotations

import json
import logging
import os
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from contracts.worker import RUNS_PATH, STATUS_PATH, OfferAnswer, RunOffer, TerminateAnswer, terminate_path
from orchestration.worker.snapshot import status

if TYPE_CHECKING:
    from orchestration.worker.process import Worker

log = logging.getLogger("shotloom.worker")


def loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def handler(worker: Worker) -> type[BaseHTTPRequestHandler]:
    import hmac

    from orchestration.launcher import WORKER_TOKEN_ENV

    token = os.environ.get(WORKER_TOKEN_ENV, "")

    class Handler(BaseHTTPRequestHandler):
        def _authorized(self) -> bool:
            """Only the control plane (holding the shared token, when one is set) may call."""
            if not token:
                return True
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return True
            self._send(401, {"error": "a worker answers the control plane only"})
            return False

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}") if length else {}

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if not self._authorized():
                return
            if self.path == STATUS_PATH:
                self._send(200, status(worker).model_dump(mode="json"))
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorized():
                return
            parts = self.path.strip("/").split("/")
            if parts == [RUNS_PATH.strip("/")]:
                try:
                    offer = RunOffer.model_validate(self._body())
                except (ValidationError, ValueError) as exc:
                    self._send(400, {"error": f"not a run offer: {exc}"})
                    return
                ok = worker.accept(offer.run_id, offer.resume)
                answer = OfferAnswer(accepted=ok, pid=os.getpid(), boot_id=worker.boot_id)
                self._send(202 if ok else 409, answer.model_dump())
            elif len(parts) == 3 and terminate_path(parts[1]) == "/" + "/".join(parts):
                ok = worker.terminate(parts[1])
                self._send(202 if ok else 409, TerminateAnswer(terminated=ok).model_dump())
            else:
                self._send(404, {"error": "not found"})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet access log
            log.debug(format, *args)

    return Handler
