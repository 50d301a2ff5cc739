"""A local stand-in for ``trl vllm-serve`` (which, in TRL 1.16, runs vLLM's own ``vllm serve`` with
TRL's flags: ``--logprobs-mode processed_logprobs`` and the weight-transfer endpoints), serving the
endpoints TRL's ``VLLMClient`` calls to generate: ``GET /health``, ``GET /v1/models``,
``GET /server_info`` and ``POST /v1/completions`` with token-id prompts, ``n``, ``seed``,
``stop_token_ids``, ``max_tokens``, ``logprobs`` and ``return_token_ids`` / ``return_tokens_as_token_ids``
(choices prompt-major, each with ``token_ids``, ``prompt_token_ids``, ``logprobs`` as
``{"tokens": ["token_id:<id>", ...], "token_logprobs", "top_logprobs"}``, ``finish_reason``,
``stop_reason``). Generation is the fake vLLM engine's (``tests/fake_vllm.py``); every request body is recorded.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests import fake_vllm
from tests.local_server import LocalServer


class FakeVLLMServer(LocalServer):
    """Serves ``llm`` (a :class:`tests.fake_vllm.LLM`) on a free 127.0.0.1 port in a thread."""

    def __init__(self, llm: fake_vllm.LLM, model: str = "policy") -> None:
        self.llm = llm
        self.model = model
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, payload: Any, status: int = 200) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?")[0]
                if path == "/health":
                    self._send({})
                elif path == "/v1/models":
                    self._send({"data": [{"id": server.model}]})
                elif path == "/server_info":
                    self._send({"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}})
                else:
                    self._send({"error": path}, 404)

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/completions":
                    self._send({"error": self.path}, 404)
                    return
                with server.lock:
                    server.bodies.append(body)
                    choices = server.complete(body)
                self._send({"choices": choices})

        super().__init__(Handler)
        self.url = self.root

    def complete(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        keys = ("n", "temperature", "top_p", "seed", "stop_token_ids", "max_tokens", "logprobs")
        params = fake_vllm.SamplingParams(**{k: body[k] for k in keys if k in body})
        choices = []
        for prompt in body["prompt"]:
            (out,) = self.llm.generate([{"prompt_token_ids": prompt}], [params], use_tqdm=False)
            for c in out.outputs:
                lps = [lp[t].logprob for lp, t in zip(c.logprobs or [], c.token_ids, strict=False)]
                tokens = [f"token_id:{t}" for t in c.token_ids]
                choices.append(
                    {
                        "index": len(choices),
                        "text": "",
                        "token_ids": c.token_ids,
                        "prompt_token_ids": prompt,
                        "logprobs": {"tokens": tokens, "token_logprobs": lps, "top_logprobs": [{}] * len(tokens)},
                        "finish_reason": c.finish_reason,
                        "stop_reason": c.stop_reason,
                    }
                )
        return choices
