"""mitmdump addon: Google's storage and auth hosts, answered by the local emulator.

Loaded by `mitmdump -s` (tests/gcs/service.py starts it). Options, set with `--set`:
- `gcs_emulator_port`: the emulator's port on 127.0.0.1.
- `gcs_latency_ms`: added to every request before it is forwarded (a bucket's round trip).
- `gcs_control_file`: a JSON file read at each request, written by `GcsService`:
  `latency_ms` overrides the option, and the first of its `faults` that matches the
  request is held for that rule's `delay_ms`, then answered by the proxy itself with
  the rule's status, if it has one (see `GcsService.inject_faults`).

Every other host gets a 502 from the proxy itself: nothing leaves 127.0.0.1.
"""

import asyncio
import json

from mitmproxy import ctx, http

STORAGE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
AUTH_HOSTS = ("oauth2.googleapis.com", "accounts.google.com", "metadata.google.internal")


class GcsEmulatorRoute:
    def load(self, loader):
        loader.add_option("gcs_emulator_port", int, 0, "the emulator's port on 127.0.0.1")
        loader.add_option("gcs_latency_ms", int, 0, "milliseconds added to every request")
        loader.add_option("gcs_control_file", str, "", "JSON: latency_ms, faults")

    async def request(self, flow: http.HTTPFlow):
        host = flow.request.pretty_host
        control = _control()
        latency_ms = control.get("latency_ms", ctx.options.gcs_latency_ms)
        if latency_ms:
            await asyncio.sleep(latency_ms / 1000)
        if host in AUTH_HOSTS:
            flow.response = http.Response.make(
                200, json.dumps({"access_token": "test-token", "token_type": "Bearer",
                                 "expires_in": 3600}), {"Content-Type": "application/json"})
            return
        if host not in STORAGE_HOSTS:
            flow.response = http.Response.make(502, f"{host} is not served here".encode())
            return
        fault = _matching_fault(control.get("faults", ()), flow.request)
        if fault is not None and fault.get("delay_ms"):
            await asyncio.sleep(fault["delay_ms"] / 1000)
        if fault is not None and fault.get("status"):
            flow.response = http.Response.make(
                fault["status"], json.dumps({"error": {"code": fault["status"],
                                                       "message": "injected by the test"}}),
                {"Content-Type": "application/json"})
            return
        # TensorFlow sends uploads with both `Transfer-Encoding: chunked` and a
        # Content-Length; mitmproxy has read the whole body, forward it plain.
        if "transfer-encoding" in flow.request.headers:
            del flow.request.headers["transfer-encoding"]
            flow.request.headers["content-length"] = str(len(flow.request.raw_content or b""))
        flow.request.scheme = "http"
        flow.request.host = "127.0.0.1"
        flow.request.port = ctx.options.gcs_emulator_port
        flow.request.headers["host"] = host  # The emulator builds its links from Host.

    def response(self, flow: http.HTTPFlow):
        # A resumable upload's session URL must lead back through the proxy, over https.
        location = flow.response.headers.get("location")
        if location and location.startswith("http://"):
            flow.response.headers["location"] = "https://" + location[len("http://"):]


def _control():
    """The control file's settings; {} when there is none."""
    try:
        with open(ctx.options.gcs_control_file) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _matching_fault(rules, request):
    """The first of `rules` that matches `request`, or None."""
    for rule in rules:
        if rule.get("methods") and request.method not in rule["methods"]:
            continue
        if rule.get("path_contains", "") not in request.path:
            continue
        return rule
    return None


addons = [GcsEmulatorRoute()]
