"""The settings of a client of an OpenAI-compatible endpoint: :class:`EndpointConfig` (where it is, the
key, concurrency, retries, timeouts, the reply cap and cache; shared by the served generator, the LLM
teacher and the judges) and :class:`ServedConfig` (the served generator's), apart from the client so
that a config or ``--help`` can name them without importing httpx or asyncio.

The key is never a setting: ``api_key_env`` names the environment variable that holds it. Plain http
goes only to a loopback host unless ``allow_insecure_http`` says otherwise.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from prorag.core.config import setting

#: Default cap on one reply, far above a long completion with per-token log-probabilities.
MAX_REPLY_BYTES = 16 << 20


def is_safe_url(url: str) -> bool:
    """Whether ``url`` is https, or plain http to a loopback host (``localhost``, 127.0.0.0/8, ``::1``).

    Plain http anywhere else sends the bearer key readable by anyone on the path, so the config
    refuses it unless ``allow_insecure_http`` says it is meant (e.g. a server on a trusted LAN).
    """
    parsed = urlsplit(url)
    if parsed.scheme == "https":
        return True
    host = (parsed.hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def no_key_if_none(env: str | None) -> str | None:
    """``api_key_env`` as given, but None for an empty name or the word ``none`` (any case): what
    ``--api-key-env none`` and a YAML ``none`` mean; no variable is really called that."""
    return None if env is None or env.strip().lower() in ("", "none") else env


@dataclass
class EndpointConfig:
    """What every client of an OpenAI-compatible endpoint sets alike (the served generator, the LLM
    teacher and judge): where it is, the key, the in-flight cap, retries and backoff, the timeout and
    the reply cache; checked once here. A subclass adds its own settings and redeclares the defaults
    that differ."""

    base_url: str = setting(help="API root, e.g. `http://127.0.0.1:8000/v1` (vLLM, SGLang) or `https://api.openai.com/v1`.")
    model: str = setting(help="Model name as the server knows it (vLLM: `--served-model-name`, by default the model path).")
    api_key_env: str | None = setting(
        None,
        help="Environment variable holding the key (never the key itself: configs get shared); it must be set. "
        "None (YAML `null`, or `none`): the server needs no key (a local vLLM or SGLang server).",
    )
    allow_insecure_http: bool = setting(
        False, help="Allow a plain `http://` base_url to a host other than loopback (the key would travel unencrypted)."
    )
    concurrency: int = setting(16, help="Requests in flight at once.")
    max_retries: int = setting(5, help="Retries of one request after the first (errors and malformed replies alike).")
    backoff_base_s: float = setting(0.5, help="First retry waits about this long, doubling (with jitter) up to `backoff_max_s`.")
    backoff_max_s: float = setting(30.0, help="Longest wait between two retries.")
    max_retry_after_s: float = setting(120.0, help="Cap on a server's `Retry-After`.")
    timeout_s: float = setting(
        120.0, help="Seconds for one request as a whole, from connecting to the reply's last byte (generation included)."
    )
    connect_timeout_s: float = setting(10.0, help="Seconds to open a connection (a server that is down is retried sooner).")
    read_timeout_s: float = setting(
        30.0,
        help="Longest silence once a reply has begun (its headers sent): a server that stalls mid-reply is retried "
        "after this, not after `timeout_s`.",
    )
    max_reply_bytes: int = setting(
        MAX_REPLY_BYTES, help="Largest reply accepted, in bytes (read as it streams; a larger one stops the run)."
    )
    cache_path: str | None = setting(None, help="Reply cache (JSONL). None: no cache.")

    def __post_init__(self) -> None:
        name = type(self).__name__
        self.api_key_env = no_key_if_none(self.api_key_env)
        if not re.match(r"^https?://", self.base_url):
            raise ValueError(f"{name}.base_url must start with http:// or https://, got {self.base_url!r}")
        if not self.allow_insecure_http and not is_safe_url(self.base_url):
            raise ValueError(
                f"{name}.base_url {self.base_url!r} is plain http to a host other than loopback: the API key "
                "would travel unencrypted; use https:// or set allow_insecure_http: true"
            )
        if not self.model:
            raise ValueError(f"{name}.model must be set")
        if self.concurrency < 1:
            raise ValueError(f"{name}.concurrency must be >= 1, got {self.concurrency}")
        for field_name in ("max_retries", "backoff_base_s", "backoff_max_s", "max_retry_after_s"):
            if getattr(self, field_name) < 0:
                raise ValueError(f"{name}.{field_name} must be >= 0, got {getattr(self, field_name)}")
        for field_name in ("timeout_s", "connect_timeout_s", "read_timeout_s", "max_reply_bytes"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"{name}.{field_name} must be > 0, got {getattr(self, field_name)}")


@dataclass
class ServedConfig(EndpointConfig):
    """Settings of a served generator (an OpenAI-compatible server: vLLM, SGLang, a hosted API)."""

    api: Literal["completions", "chat"] = setting(
        "completions",
        help="`completions`: the prompt is sent as is (the baselines' prompts are plain text); `chat`: it is the "
        "user message, after `system_prompt` if set (hosted chat-only models).",
    )
    cache_path: str | None = setting(None, help="Reply cache (JSONL) of greedy requests. None: no cache.")
    system_prompt: str | None = setting(None, help="`chat` only: a system message sent before each prompt.")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + ("/completions" if self.api == "completions" else "/chat/completions")
