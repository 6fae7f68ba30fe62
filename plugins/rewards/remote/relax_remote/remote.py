"""The ``remote`` scorer: a reward server reached over HTTP.

Request: ``POST <--rm-url>`` with ``Content-Type: application/json`` and the body
``{"prompt": str | null, "response": str, "label": ..., "metadata": {...}}`` (the prompt is
``metadata["prompt"]``, which the training loop fills in).  Reply: a JSON number, ``null``
(cannot be scored), or an object with a ``"reward"`` member holding one of those.

Failures: a connection error, a timeout (``--rm-request-timeout`` seconds per request) or an
HTTP 429/5xx reply is retried up to ``--rm-max-retries`` times, waiting ``--rm-backoff``
seconds before the first retry and doubling after each.  Other HTTP errors (4xx: the request
itself is wrong) are not retried.  When every attempt fails the call raises
:class:`RemoteRewardError` naming the URL, the attempts and the last error; the reward
stage then counts the sample as an error (reward ``None``) and the run goes on.  The whole
call is also bounded by ``--reward-timeout``.

Only ``http``/``https`` URLs are accepted.  Point ``--rm-url`` at a server you trust: the
response text, label and metadata of every sample are sent to it.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

log = logging.getLogger("relax.remote")

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class RemoteRewardError(RuntimeError):
    """The reward server could not give a reward (unreachable, or a bad reply)."""


@dataclass(frozen=True)
class RemoteScorer:
    """``fn(response, label, metadata) -> float | None`` asking ``url`` (picklable)."""

    url: str
    request_timeout: float = 5.0
    max_retries: int = 3
    backoff: float = 0.5

    def worst_case_seconds(self) -> float:
        """Longest a call can take: every attempt times out, plus the back-off waits."""
        n = self.max_retries
        return (n + 1) * self.request_timeout + self.backoff * (2 ** n - 1)

    def _post(self, body: bytes) -> Any:
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=self.request_timeout) as reply:
            return json.loads(reply.read().decode("utf-8"))

    def __call__(self, response: str, label: Any, metadata: dict | None = None) -> float | None:
        metadata = dict(metadata or {})
        body = json.dumps({"prompt": metadata.get("prompt"), "response": response, "label": label,
                           "metadata": metadata}, default=str).encode("utf-8")
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                data = self._post(body)
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code} {e.reason}"
                if e.code not in _RETRY_STATUS:
                    raise RemoteRewardError(f"reward server {self.url} refused the request: {last}") from None
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                reason = getattr(e, "reason", e)
                last = f"{type(reason).__name__}: {reason}"
                continue
            except json.JSONDecodeError as e:
                raise RemoteRewardError(f"reward server {self.url} replied with invalid JSON: {e}") from None
            return _reward_of(data, self.url)
        raise RemoteRewardError(f"reward server {self.url} unreachable after {self.max_retries + 1} "
                                f"attempt(s): {last} (is it running? check --rm-url)")


def _reward_of(data: Any, url: str) -> float | None:
    if isinstance(data, dict):
        if "reward" not in data:
            raise RemoteRewardError(f"reward server {url} replied with an object without 'reward': {str(data)[:200]}")
        data = data["reward"]
    if data is None:
        return None
    if isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data)
    raise RemoteRewardError(f"reward server {url} replied {str(data)[:200]!r}; expected a number, null or {{\"reward\": ...}}")


def build(params: Any, config: Any) -> RemoteScorer:
    """Build from ``--rm-url`` and the plugin parameters.

    Raises:
        ValueError: no ``--rm-url``, or not an http(s) URL.
    """
    url = getattr(config, "rm_url", None)
    if not url:
        raise ValueError("the remote scorer needs --rm-url (the reward server's http:// address)")
    if urlparse(url).scheme not in ("http", "https") or not urlparse(url).netloc:
        raise ValueError(f"--rm-url must be an http:// or https:// URL, got {url!r}")
    scorer = RemoteScorer(url, params.request_timeout, params.max_retries, params.backoff)
    reward_timeout = getattr(config, "reward_timeout", None)
    if reward_timeout is not None and scorer.worst_case_seconds() > reward_timeout:
        log.warning("remote scorer: retries may take up to %.1f s, more than --reward-timeout %.1f s; "
                    "the reward stage stops the call at the timeout", scorer.worst_case_seconds(), reward_timeout)
    return scorer
