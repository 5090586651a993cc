"""The one place that talks to ``kubernetes_asyncio``: configuration loading, JSON requests,
watches, and the mapping of its exceptions onto :mod:`agentbox.errors`.

Requests go through the library's ``ApiClient`` (its kubeconfig/in-cluster loading, auth
headers, TLS and aiohttp connection pool) but as plain JSON: the generated models cost time
to build and serialise ``MicroTime`` fields in a form the API server may refuse, and every
resource agentbox uses is read as a dict anyway.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from ._version import __version__
from .errors import (
    ApiError,
    ConflictError,
    InvalidSpecError,
    NotFoundError,
    ProtocolError,
    TransportError,
)

#: Bound on every non-watch request (the linkerd rule: no write without a timeout).
REQUEST_TIMEOUT = 30.0

_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

USER_AGENT = f"agentbox-python/{__version__}"


async def load_api_client() -> Any:
    """An ``ApiClient`` from the in-cluster service account, else the kubeconfig
    (``$KUBECONFIG`` or ``~/.kube/config``).
    """
    cfg = k8s_client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=cfg)
    else:
        await k8s_config.load_kube_config(client_configuration=cfg)
    api = k8s_client.ApiClient(configuration=cfg)
    api.user_agent = USER_AGENT
    base: aiohttp.ClientSession = api.rest_client.pool_manager
    if base.trust_env and not urllib.request.getproxies():
        # The same connector (TLS context, pool) without trust_env: see Kube.session.
        connector = base.connector
        base.detach()
        api.rest_client.pool_manager = aiohttp.ClientSession(
            connector=connector, trust_env=False, read_bufsize=2**21
        )
    return api


def default_namespace() -> str:
    """The namespace of the kubeconfig's current context, else the service account's, else
    ``default``.
    """
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            with open(_SA_NAMESPACE, encoding="utf-8") as f:
                return f.read().strip() or "default"
        except OSError:
            return "default"
    try:
        _, active = k8s_config.list_kube_config_contexts()
    except Exception:  # no kubeconfig: the API client will say so when it is loaded
        return "default"
    ns = (active or {}).get("context", {}).get("namespace")
    return str(ns) if ns else "default"


def api_error(exc: BaseException) -> Exception:
    """Maps a library or transport exception to an SDK error (others are returned as-is)."""
    if isinstance(exc, k8s_client.ApiException):
        return status_error(int(exc.status or 0), exc.reason or "", exc.body)
    if isinstance(exc, (aiohttp.ClientError, OSError, asyncio.TimeoutError)):
        return TransportError(f"cannot reach the API server: {exc!r}")
    return exc if isinstance(exc, Exception) else RuntimeError(repr(exc))


def status_error(code: int, http_reason: str, body: Any) -> Exception:
    """The SDK error for a failed response, with the Status object's reason and message."""
    reason, message = http_reason, ""
    data: Any = body
    if isinstance(body, (bytes, str)):
        try:
            data = json.loads(body)
        except ValueError:
            data = None
            message = body.decode(errors="replace") if isinstance(body, bytes) else body
    if isinstance(data, Mapping):
        reason = str(data.get("reason") or reason)
        message = str(data.get("message") or message)
    if code == 404:
        return NotFoundError(message or "not found")
    if code == 409:
        return ConflictError(code, reason, message)
    if code == 422:
        return InvalidSpecError(code, reason, message)
    return ApiError(code, reason, message)


class Kube:
    """JSON requests against one API server through one ``ApiClient``."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        self._ws_session: aiohttp.ClientSession | None = None

    async def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One request; the response body as a dict."""
        try:
            data = await self.api_client.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                response_types_map={200: "object", 201: "object", 202: "object"},
                _return_http_data_only=True,
                _request_timeout=REQUEST_TIMEOUT,
            )
        except Exception as e:
            raise api_error(e) from e
        if not isinstance(data, dict):
            raise ProtocolError(
                f"{method} {path}: expected a JSON object, got {type(data).__name__}"
            )
        return data

    async def get_opt(self, path: str) -> dict[str, Any] | None:
        """GET, or ``None`` on 404."""
        try:
            return await self.call("GET", path)
        except NotFoundError:
            return None

    async def watch(
        self, path: str, *, query: Mapping[str, str], timeout: float | None
    ) -> AsyncIterator[dict[str, Any]]:
        """The events of one watch request (``{"type": ..., "object": ...}``) until the server
        ends it or ``timeout`` passes (then it just stops).
        """
        q = dict(query)
        q["watch"] = "true"
        if timeout is not None:
            q["timeoutSeconds"] = str(max(1, int(timeout + 0.999)))
        try:
            resp = await self.api_client.call_api(
                path,
                "GET",
                query_params=list(q.items()),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=aiohttp.ClientTimeout(
                    total=None if timeout is None else timeout + REQUEST_TIMEOUT,
                    sock_connect=REQUEST_TIMEOUT,
                ),
            )
        except Exception as e:
            raise api_error(e) from e
        try:
            if resp.status >= 300:
                raise status_error(resp.status, resp.reason or "", await resp.read())
            while True:
                try:
                    line = await resp.content.readline()
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                    raise TransportError(f"watch broke: {e!r}") from e
                if not line:
                    return
                if line.strip():
                    event = json.loads(line)
                    if isinstance(event, dict):
                        yield event
        finally:
            resp.release()

    def url(self, path: str) -> str:
        """Absolute URL of an API path."""
        return str(self.api_client.configuration.host).rstrip("/") + path

    async def auth_headers(self) -> dict[str, str]:
        """The headers that authenticate a request (bearer token when there is one), refreshed
        the way the library refreshes them.
        """
        headers: dict[str, str] = {}
        settings = await self.api_client.configuration.auth_settings()
        for s in settings.values():
            if s.get("in") == "header":
                headers[s["key"]] = s["value"]
        headers.update(self.api_client.default_headers)
        return headers

    async def ws_connect(
        self, path: str, query: Sequence[tuple[str, str]], protocols: Sequence[str], what: str
    ) -> aiohttp.ClientWebSocketResponse[bool]:
        """Opens a WebSocket on an API path (a pod's ``exec`` or ``portforward``), offering
        ``protocols`` in order; ``what`` names the target in errors (404 →
        :class:`~agentbox.errors.NotFoundError`, other refusals → ``ApiError``, an unreachable
        server → ``TransportError``).
        """
        url = self.url(path) + "?" + urlencode(query)
        if url.startswith("https://"):
            url = "wss://" + url[len("https://") :]
        elif url.startswith("http://"):
            url = "ws://" + url[len("http://") :]
        headers = await self.auth_headers()
        try:
            return await self.session.ws_connect(
                url,
                protocols=tuple(protocols),
                headers=headers,
                max_msg_size=0,
                autoclose=True,
                autoping=True,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=5.0),
            )
        except aiohttp.WSServerHandshakeError as e:
            if e.status == 404:
                raise NotFoundError(f"{what} not found") from e
            raise ApiError(e.status, "", f"{what}: {e.message}") from e
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise TransportError(f"cannot open a WebSocket to {what}: {e!r}") from e

    @property
    def session(self) -> aiohttp.ClientSession:
        """The session exec WebSockets open on: the library's connector (its TLS context and
        connection pool) without ``trust_env`` when no proxy is configured in the environment.

        The library's session trusts the environment, which costs every request two trips to
        a worker thread (a ``.netrc`` lookup and a proxy lookup): on a busy machine that shows
        in a one-shot exec's latency. With a proxy in the environment the library's session is
        used as it is, so the proxy still applies.
        """
        base: aiohttp.ClientSession = self.api_client.rest_client.pool_manager
        if not base.trust_env or urllib.request.getproxies():
            return base
        if self._ws_session is None or self._ws_session.closed:
            self._ws_session = aiohttp.ClientSession(
                connector=base.connector, connector_owner=False, trust_env=False
            )
        return self._ws_session

    async def close(self) -> None:
        """Closes the ApiClient's connections."""
        if self._ws_session is not None:
            await self._ws_session.close()
        await self.api_client.close()


#: Where an object gets its API connection, made on first use.
KubeSource = Callable[[], Awaitable[Kube]]

#: Paths of the resources agentbox uses.
GROUP = "agentbox.dev"
VERSION = "v1alpha1"


def sandboxes_path(ns: str, name: str | None = None) -> str:
    """Path of the Sandboxes of a namespace, or of one."""
    p = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/sandboxes"
    return f"{p}/{name}" if name else p


def snapshots_path(ns: str, name: str | None = None) -> str:
    """Path of the SandboxSnapshots of a namespace, or of one."""
    p = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/sandboxsnapshots"
    return f"{p}/{name}" if name else p


def templates_path(ns: str, name: str | None = None) -> str:
    """Path of the SandboxTemplates of a namespace, or of one."""
    p = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/sandboxtemplates"
    return f"{p}/{name}" if name else p


def pools_path(ns: str, name: str | None = None) -> str:
    """Path of the SandboxPools of a namespace, or of one."""
    p = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/sandboxpools"
    return f"{p}/{name}" if name else p


def leases_path(ns: str, name: str | None = None) -> str:
    """Path of the Leases of a namespace, or of one."""
    p = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    return f"{p}/{name}" if name else p


def pod_path(ns: str, pod: str) -> str:
    """Path of a pod."""
    return f"/api/v1/namespaces/{ns}/pods/{pod}"


def pod_exec_path(ns: str, pod: str) -> str:
    """Path of a pod's exec subresource."""
    return f"/api/v1/namespaces/{ns}/pods/{pod}/exec"


def pod_portforward_path(ns: str, pod: str) -> str:
    """Path of a pod's portforward subresource."""
    return f"/api/v1/namespaces/{ns}/pods/{pod}/portforward"
