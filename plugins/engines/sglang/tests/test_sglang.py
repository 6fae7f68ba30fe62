"""SGLang engine on CPU: request building and response decoding against recorded example
payloads (written from SGLang's documented native API), the server command line, the
weight-update sequence against a stand-in HTTP server, and the capability declarations."""

from __future__ import annotations

import base64
import json
import struct
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch")

from relax_core.batch import TOP_K_HEAD  # noqa: E402
from relax_core.contracts import SamplingParams  # noqa: E402
from relax_sglang import protocol  # noqa: E402
from relax_sglang.engine import SGLangEngine, _Server  # noqa: E402

PAYLOADS = Path(__file__).parent / "payloads"


def _load(name: str):
    return json.loads((PAYLOADS / name).read_text())


def test_generate_payload_matches_recorded_request():
    s = SamplingParams(temperature=0.8, max_new_tokens=3, stop=("\n\n",), seed=100,
                       fields=TOP_K_HEAD | {"routed_experts"}, top_k_width=2)
    assert protocol.generate_payload([[5, 6, 7], [8, 9]], s) == _load("generate_request.json")


def test_generate_payload_minimal_and_refusals():
    body = protocol.generate_payload([[1]], SamplingParams())
    assert "top_logprobs_num" not in body and "return_routed_experts" not in body
    assert "sampling_seed" not in body["sampling_params"][0] and "stop" not in body["sampling_params"][0]
    with pytest.raises(ValueError, match="top-p"):
        protocol.generate_payload([[1]], SamplingParams(top_p=0.9))
    with pytest.raises(ValueError, match="top_k=5"):
        protocol.generate_payload([[1]], SamplingParams(top_k=5))
    with pytest.raises(ValueError, match="at least one prompt"):
        protocol.generate_payload([], SamplingParams())


def _rows(j: int) -> list[list[int]]:
    """Row j of the recorded routed-experts payload: value (4j + 2l + e) mod 8."""
    return [[(j * 4 + l * 2 + e) % 8 for e in range(2)] for l in range(2)]


def test_decode_recorded_moe_response():
    out = protocol.decode_generate_response(_load("generate_response_moe.json"), [3, 2], pad_id=0, top_k=2,
                                            routed_shape=(2, 2))
    assert out.response_ids.tolist() == [[19, 30, 2], [11, 12, 0]]
    assert out.response_lengths.tolist() == [3, 2]
    assert out.rollout_log_probs[0].tolist() == [-0.25, -1.5, -0.125]
    assert out.rollout_log_probs[1, :2].tolist() == [-0.5, -0.0625]
    assert out.truncated.tolist() == [False, True]  # "stop" vs "length"
    assert out.responses == [" 4.", "ab"]
    assert out.top_k_ids[0].tolist() == [[19, 7], [31, 30], [2, 5]]
    assert out.top_k_log_probs[0, 1].tolist() == [-0.75, -1.5]
    assert out.top_k_log_probs[1, 2].isneginf().all()
    # response token t is predicted from the input at row P - 1 + t
    assert out.routed_experts.shape == (2, 3, 2, 2)
    assert out.routed_experts[0].tolist() == [_rows(2), _rows(3), _rows(4)]
    assert out.routed_experts[1, :2].tolist() == [_rows(1), _rows(2)]
    assert (out.routed_experts[1, 2] == -1).all()


def test_decode_errors():
    with pytest.raises(ValueError, match="aborted"):
        protocol.decode_generate_response(_load("generate_response_aborted.json"), [1], pad_id=0)
    items = _load("generate_response_moe.json")
    with pytest.raises(ValueError, match="narrower than k = 3"):
        protocol.decode_generate_response(items, [3, 2], pad_id=0, top_k=3)
    with pytest.raises(ValueError, match="5 rows, expected prompt 4"):
        protocol.decode_generate_response(items, [4, 2], pad_id=0, routed_shape=(2, 2))
    with pytest.raises(ValueError, match="not rows"):
        protocol.decode_routed_experts(base64.b64encode(struct.pack("<3i", 1, 2, 3)).decode(), num_layers=2, top_k=2)
    with pytest.raises(ValueError, match="output_token_logprobs"):
        protocol.decode_generate_response([{"text": "", "meta_info": {}}], [1], pad_id=0)


def test_server_command():
    cmd = protocol.server_command("/m", port=30001, tp=2, mem_fraction_static=0.4, seed=7, context_length=4096,
                                  routed_experts=True, python="py")
    assert cmd[:3] == ["py", "-m", "sglang.launch_server"]
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags["--model-path"] == "/m" and flags["--host"] == "127.0.0.1" and flags["--port"] == "30001"
    assert flags["--tp-size"] == "2" and flags["--mem-fraction-static"] == "0.4" and flags["--random-seed"] == "7"
    assert "--context-length" in cmd and "--enable-return-routed-experts" in cmd and "--skip-server-warmup" in cmd
    plain = protocol.server_command("/m", port=1)
    assert "--enable-return-routed-experts" not in plain and "--context-length" not in plain


class _FakeSGLang(BaseHTTPRequestHandler):
    calls: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _FakeSGLang.calls.append((self.path, body))
        reply = {"/update_weights_from_disk": _load("update_weights_from_disk_response.json"),
                 "/generate": _load("generate_response_moe.json")}.get(self.path, {"success": True})
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_engine(tmp_path):
    httpd = HTTPServer(("127.0.0.1", 0), _FakeSGLang)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_experts": 8, "num_experts_per_tok": 2}))
    server = _Server.__new__(_Server)
    server.url, server.timeout, server.proc = f"http://127.0.0.1:{httpd.server_port}", 10, NS(poll=lambda: 0)
    eng = SGLangEngine.__new__(SGLangEngine)
    eng.__dict__.update(model_path=str(model), tokenizer=None, pad_id=0, routed_shape=(2, 2), mode="server",
                        version=0, _weights_dir=tmp_path / "w", _server=server, _engine=None)
    (tmp_path / "w").mkdir()
    _FakeSGLang.calls = []
    yield eng
    httpd.shutdown()


def test_weight_update_pauses_updates_and_continues(fake_engine):
    sd = {"model.embed_tokens.weight": torch.ones(4, 2), "lm_head.weight": None}
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]  # tied: shared storage must still save
    fake_engine.update_weights(sd, version=5)
    paths = [p for p, _ in _FakeSGLang.calls]
    assert paths == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
    assert _FakeSGLang.calls[0][1] == {"mode": "retract"}
    upd = _FakeSGLang.calls[1][1]
    assert upd == {"model_path": str(fake_engine._weights_dir), "flush_cache": True, "weight_version": "5"}
    from safetensors.torch import load_file

    saved = load_file(str(fake_engine._weights_dir / "model.safetensors"))
    assert torch.equal(saved["lm_head.weight"], torch.ones(4, 2))
    assert (fake_engine._weights_dir / "config.json").is_file() and fake_engine.version == 5


def test_generate_round_trip_over_http(fake_engine):
    s = SamplingParams(temperature=0.8, max_new_tokens=3, stop=("\n\n",), seed=100,
                       fields=TOP_K_HEAD | {"routed_experts"}, top_k_width=2)
    out = fake_engine.generate([[5, 6, 7], [8, 9]], s)
    assert _FakeSGLang.calls == [("/generate", _load("generate_request.json"))]
    assert out.routed_experts[0, 0].tolist() == _rows(2)


def test_capabilities_and_startup_validation():
    from relax_core.config import RunConfig
    from relax_core.host.plugins import load_registry
    from relax_core.host.validation import resolve

    reg = load_registry()
    caps = reg.get("engine", "sglang").spec.capabilities_for()
    assert caps.devices == frozenset({"cuda"}) and {"routed_experts", "top_k_log_probs"} <= caps.provides_fields
    _, problems = resolve(RunConfig(rollout_engine="sglang", device="cpu"), reg)
    assert any(p.constraint == "devices" and "sglang" in p.component for p in problems)
    _, problems = resolve(RunConfig(rollout_engine="sglang", device="cuda"), reg)
    assert not [p for p in problems if "sglang" in p.component]


def test_contract():
    from relax_authoring.testing import check_contract
    from relax_sglang.plugin import relax_register_rollout_engines

    check_contract(relax_register_rollout_engines()[0])
