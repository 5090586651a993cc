"""Exposed ports: where the ports of a Sandbox's ``spec.ports`` are reached
(:class:`Endpoint`, from ``status.endpoints``), and :class:`PortForward`, a listener on this
machine's loopback whose connections reach a port of the sandbox's pod through the API server
(``pods/portforward``) — for a harness outside the cluster, which can reach neither the pod
network nor the Service.

Why the port-forward protocol is spoken here: ``kubernetes_asyncio``'s port-forward helper
reads from a WebSocket it owns for the whole listener; the SDK opens one WebSocket per
accepted connection (as kube-rs and ``kubectl`` over WebSockets do), so each TCP connection has
its own stream and its own end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from ._kube import KubeSource, pod_portforward_path
from .errors import InvalidRequestError, TransportError

__all__ = ["Endpoint", "PortForward"]

#: Subprotocols of a port-forward WebSocket (the binary channel protocol).
PROTOCOLS = ("v4.channel.k8s.io", "channel.k8s.io")
#: Largest chunk read from a local connection and sent in one frame.
CHUNK = 64 << 10


@dataclass(frozen=True)
class Endpoint:
    """Where one exposed port of a sandbox is reached (an entry of ``status.endpoints``)."""

    #: The port's name in ``spec.ports``.
    name: str
    #: Port number (the same on the Service and in the pod).
    port: int
    #: ``TCP``, ``UDP`` or ``SCTP``.
    protocol: Literal["TCP", "UDP", "SCTP"]
    #: The Service's cluster DNS name, ``<service>.<namespace>.svc``: reaches the port from
    #: pods of the cluster.
    host: str
    #: The pod's IP while it runs (reaches the port on the pod network, also on clusters
    #: without DNS or a Service proxy); ``None`` while there is no pod.
    pod_ip: str | None = None

    @classmethod
    def from_status(cls, entry: Mapping[str, Any]) -> Endpoint:
        """Reads one ``status.endpoints`` entry."""
        return cls(
            name=str(entry.get("name", "")),
            port=int(entry.get("port", 0)),
            protocol=entry.get("protocol") or "TCP",
            host=str(entry.get("host", "")),
            pod_ip=entry.get("podIP") or None,
        )


def data_frame(payload: bytes) -> bytes:
    """A frame for the data channel of the first (only) forwarded port."""
    return b"\x00" + payload


class ChannelReader:
    """Splits the frames of a port-forward WebSocket into data and error bytes (pure state).

    The first frame on each channel carries only the port number (two bytes, little endian);
    after that, channel 0 is the stream's data and channel 1 an error text from the kubelet.
    """

    def __init__(self) -> None:
        self._headers_seen: set[int] = set()
        #: Error text received so far.
        self.error = bytearray()

    def feed(self, frame: bytes) -> bytes:
        """The data bytes in one frame (``b""`` for a header or an error frame)."""
        if not frame:
            return b""
        channel, payload = frame[0], frame[1:]
        if channel not in self._headers_seen:
            self._headers_seen.add(channel)
            payload = payload[2:]
        if channel == 0:
            return bytes(payload)
        if channel == 1:
            self.error += payload
        return b""


class PortForward:
    """A TCP listener on ``127.0.0.1`` whose every connection is forwarded to ``port`` of a
    sandbox's pod through the API server. Get one from
    :meth:`agentbox.Sandbox.port_forward`; use it with ``async with`` (or :meth:`start` and
    :meth:`close`). :attr:`host` and :attr:`local_port` say where to connect.
    """

    def __init__(
        self, kube: KubeSource, namespace: str, pod: str, port: int, local_port: int = 0
    ) -> None:
        if not 1 <= port <= 65535:
            raise InvalidRequestError(f"port must be 1..65535, not {port}")
        if not 0 <= local_port <= 65535:
            raise InvalidRequestError(f"local_port must be 0..65535, not {local_port}")
        self._kube = kube
        self.namespace = namespace
        self.pod = pod
        #: The pod's port.
        self.port = port
        #: Where the listener is (loopback only).
        self.host = "127.0.0.1"
        #: The local port (chosen by the system when 0 was asked for), once started.
        self.local_port = local_port
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: The last error a forwarded connection met (the kubelet's message, or a transport
        #: error), for diagnostics.
        self.last_error: str = ""

    async def start(self) -> PortForward:
        """Starts listening."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, self.host, self.local_port)
            self.local_port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aenter__(self) -> PortForward:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stops listening and ends the connections it forwards."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._pump(reader, writer)
        except (TransportError, aiohttp.ClientError, OSError) as e:
            self.last_error = str(e)
        except Exception as e:  # an API refusal (pod gone...): end this connection only
            self.last_error = str(e)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if task is not None:
                self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kube = await self._kube()
        ws = await kube.ws_connect(
            pod_portforward_path(self.namespace, self.pod),
            [("ports", str(self.port))],
            PROTOCOLS,
            f"pod {self.namespace}/{self.pod} (port-forward to {self.port})",
        )
        frames = ChannelReader()

        async def upstream() -> None:
            # Local → pod. The protocol cannot half-close a stream: the local end's EOF ends
            # the forwarded connection once the pod's answer is in (the downstream side).
            while True:
                chunk = await reader.read(CHUNK)
                if not chunk:
                    return
                await ws.send_bytes(data_frame(chunk))

        up = asyncio.ensure_future(upstream())
        try:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    data = frames.feed(msg.data)
                    if data:
                        writer.write(data)
                        await writer.drain()
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    raise TransportError(f"port-forward stream failed: {ws.exception()!r}")
            if frames.error:
                self.last_error = frames.error.decode(errors="replace")
        finally:
            up.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await up
            await ws.close()
