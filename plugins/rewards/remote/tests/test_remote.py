"""The ``remote`` scorer against a local ``http.server`` on 127.0.0.1 (no other network)."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from relax_remote.plugin import RemoteParams, relax_register_reward_scorers
from relax_remote.remote import RemoteRewardError, RemoteScorer, build


class _Server:
    """A reward server whose replies follow a script: a list of (status, body, delay)."""

    def __init__(self, script):
        self.script, self.requests = list(script), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                status, reply, delay = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                time.sleep(delay)
                payload = json.dumps(reply(body) if callable(reply) else reply).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads, self.httpd.block_on_close = True, False
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/reward"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _exact(body):
    return {"reward": float(body["response"].strip() == str(body["label"]))}


def test_posts_prompt_response_label_and_reads_the_reward():
    with _Server([(200, _exact, 0)]) as srv:
        s = RemoteScorer(srv.url, request_timeout=2, max_retries=0)
        assert s("42", 42, {"prompt": "6*7?", "rg_dataset": "x"}) == 1.0
        assert s("41", 42, {"prompt": "6*7?"}) == 0.0
        first = srv.requests[0]
        assert first["prompt"] == "6*7?" and first["response"] == "42" and first["label"] == 42
        assert first["metadata"]["rg_dataset"] == "x"


@pytest.mark.parametrize("reply, expected", [(0.25, 0.25), (1, 1.0), (None, None), ({"reward": None}, None)])
def test_reply_forms(reply, expected):
    with _Server([(200, reply, 0)]) as srv:
        assert RemoteScorer(srv.url, max_retries=0)("r", "l", {}) == expected


@pytest.mark.parametrize("reply, match", [("good", "expected a number"), ({"score": 1}, "without 'reward'"),
                                          (True, "expected a number")])
def test_bad_replies_raise(reply, match):
    with _Server([(200, reply, 0)]) as srv:
        with pytest.raises(RemoteRewardError, match=match):
            RemoteScorer(srv.url, max_retries=0)("r", "l", {})


def test_retries_with_backoff_then_succeeds():
    with _Server([(503, {}, 0), (503, {}, 0), (200, {"reward": 0.5}, 0)]) as srv:
        s = RemoteScorer(srv.url, request_timeout=2, max_retries=3, backoff=0.05)
        t0 = time.monotonic()
        assert s("r", "l", {}) == 0.5
        # two retries: waits 0.05 + 0.10 s before them
        assert len(srv.requests) == 3 and time.monotonic() - t0 >= 0.15


def test_bounded_retries_then_a_clear_error():
    with _Server([(500, {}, 0)]) as srv:
        s = RemoteScorer(srv.url, request_timeout=2, max_retries=2, backoff=0.01)
        with pytest.raises(RemoteRewardError, match=r"unreachable after 3 attempt\(s\): HTTP 500"):
            s("r", "l", {})
        assert len(srv.requests) == 3


def test_client_errors_are_not_retried():
    with _Server([(400, {}, 0)]) as srv:
        with pytest.raises(RemoteRewardError, match="refused the request: HTTP 400"):
            RemoteScorer(srv.url, max_retries=3, backoff=0.01)("r", "l", {})
        assert len(srv.requests) == 1


def test_unreachable_server_is_a_clear_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens on this port now
    s = RemoteScorer(f"http://127.0.0.1:{port}/", request_timeout=1, max_retries=1, backoff=0.01)
    t0 = time.monotonic()
    with pytest.raises(RemoteRewardError, match=rf"127.0.0.1:{port}/ unreachable after 2 attempt\(s\).*check --rm-url"):
        s("r", "l", {})
    assert time.monotonic() - t0 < 2


def test_slow_server_times_out_per_request():
    with _Server([(200, {"reward": 1.0}, 1.0)]) as srv:
        s = RemoteScorer(srv.url, request_timeout=0.2, max_retries=1, backoff=0.01)
        t0 = time.monotonic()
        with pytest.raises(RemoteRewardError, match="unreachable after 2 attempt"):
            s("r", "l", {})
        assert time.monotonic() - t0 < 1.0
    assert s.worst_case_seconds() == pytest.approx(2 * 0.2 + 0.01)


def test_build_needs_an_http_url():
    p = RemoteParams()
    with pytest.raises(ValueError, match="needs --rm-url"):
        build(p, SimpleNamespace(rm_url=None, reward_timeout=10))
    with pytest.raises(ValueError, match="http:// or https://"):
        build(p, SimpleNamespace(rm_url="file:///etc/passwd", reward_timeout=10))
    s = build(RemoteParams(request_timeout=1.0, max_retries=1, backoff=0.1),
              SimpleNamespace(rm_url="http://127.0.0.1:9/r", reward_timeout=10))
    assert (s.url, s.request_timeout, s.max_retries, s.backoff) == ("http://127.0.0.1:9/r", 1.0, 1, 0.1)


def test_registration():
    (spec,) = relax_register_reward_scorers()
    assert spec.name == "remote" and spec.params is RemoteParams


def test_contract():
    from relax_authoring.testing import check_contract
    from relax_core.config import RunConfig

    (spec,) = relax_register_reward_scorers()
    with _Server([(200, {"reward": 0.0}, 0)]) as srv:
        check_contract(spec, config=RunConfig(rm_url=srv.url, plugin_params={"remote": RemoteParams()}))
        assert srv.requests  # the kit's cases reached the server
