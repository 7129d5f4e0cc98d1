"""The outbound HTTP client (src/contentsvc/outbound_http.py: httpx over asyncio's streams), against
real loopback servers: plain HTTP/1.1 with keep-alive, TLS with a certificate made here, and the
failures the deliveries worker tells apart (decisions-part2 "Deliveries": an attempt's error code is
timeout, connect_error, tls_error or invalid_response; docs/decisions.md "Outbound HTTP").
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from contentsvc.bench.outbound import read_request
from contentsvc.config.settings import DeliverySettings, DestinationSettings, Settings
from contentsvc.monitoring.deliverer import DeliveriesWorker
from contentsvc.monitoring.deliveries import Claim
from contentsvc.outbound_http import AsyncioBackend, outbound_client

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
SECRET = "whsec_" + "c2VjcmV0LWJ5dGVzLWZvci1vdXRib3VuZC10ZXN0cw=="


class Server:
    """A loopback HTTP/1.1 server in the test's event loop that answers each request with `answer`,
    counting connections and requests; `after_answer` runs after each answer (to close or to
    send bytes nobody asked for)."""

    def __init__(self, answer: bytes = OK, after_answer=None, ssl_context: ssl.SSLContext | None = None,
                 silent: bool = False) -> None:
        self.answer, self.after_answer, self.ssl_context, self.silent = answer, after_answer, ssl_context, silent
        self.connections = 0
        self.requests = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl_context)
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/hook"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                await read_request(reader)
                self.requests += 1
                if self.silent:
                    await asyncio.sleep(30)
                writer.write(self.answer)
                await writer.drain()
                if self.after_answer is not None:
                    await self.after_answer(writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def tls_server_context(tmp_path) -> tuple[ssl.SSLContext, Path]:
    cert, key = _certificate(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context, cert


def test_requests_share_one_kept_alive_connection():
    async def scenario():
        async with Server() as server, outbound_client(trust_env=False) as client:
            answers = [await client.post(server.url(), content=b'{"n": %d}' % i) for i in range(5)]
            return [(a.status_code, a.text) for a in answers], server.connections, server.requests

    answers, connections, requests = asyncio.run(scenario())
    assert answers == [(200, "ok")] * 5
    assert (connections, requests) == (1, 5)


@pytest.mark.parametrize("after_answer", ["close", "stray_bytes"])
def test_a_connection_the_server_ended_while_idle_is_not_reused(after_answer):
    # A pooled connection whose other side closed it, or sent bytes nobody asked for (an answer
    # read then would be taken for the next request's), is dropped before the next request: that
    # request gets its own answer on a new connection.
    async def close(writer):
        if after_answer == "stray_bytes":
            await asyncio.sleep(0.05)  # after the client has read its answer: onto the idle connection
            writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        else:
            writer.close()

    async def scenario():
        async with Server(after_answer=close) as server, outbound_client(trust_env=False) as client:
            first = await client.post(server.url(), content=b"1")
            await asyncio.sleep(0.2)  # the close or the stray bytes arrive while the connection is idle
            second = await client.post(server.url(), content=b"2")
            return first.status_code, second.status_code, second.text, server.connections

    first, second, text, connections = asyncio.run(scenario())
    assert (first, second, text) == (200, 200, "ok")
    assert connections == 2


def test_refused_connection_and_silent_server_are_httpx_errors():
    async def scenario():
        # A port bound and not listening refuses every connection for as long as it is held.
        with socket.socket() as closed_port:
            closed_port.bind(("127.0.0.1", 0))
            refused_url = f"http://127.0.0.1:{closed_port.getsockname()[1]}/hook"
            async with Server(silent=True) as silent, outbound_client(trust_env=False, timeout=0.3) as client:
                with pytest.raises(httpx.ConnectError):
                    await client.post(refused_url, content=b"x")
                with pytest.raises(httpx.ReadTimeout):
                    await client.post(silent.url(), content=b"x")
                return silent.requests

    assert asyncio.run(scenario()) == 1


def test_tls_with_a_trusted_certificate(tls_server_context):
    context, cert = tls_server_context

    async def scenario():
        async with Server(ssl_context=context) as server, \
                outbound_client(verify=ssl.create_default_context(cafile=str(cert)), trust_env=False) as client:
            answers = [await client.post(server.url("https"), content=b"x") for _ in range(3)]
            return [a.text for a in answers], server.connections

    texts, connections = asyncio.run(scenario())
    assert texts == ["ok"] * 3 and connections == 1


def test_an_untrusted_certificate_is_a_tls_error_of_the_attempt(tls_server_context):
    # decisions-part2 "Deliveries": a failed handshake is the attempt's `tls_error`, told apart
    # from `connect_error` by the ssl.SSLError this client keeps in the exception's chain.
    context, _ = tls_server_context

    async def scenario():
        async with Server(ssl_context=context) as server, Server() as plain:
            settings = Settings(deliveries=DeliverySettings(attempt_timeout_seconds=5), destinations={
                "tls": DestinationSettings(url=server.url("https"), secret=SECRET),
                "plain": DestinationSettings(url=plain.url(), secret=SECRET)})
            worker = DeliveriesWorker(settings)
            try:
                outcomes = [await worker.send(Claim(f"dlv_{name}", f"msg_{name}", name, b"{}", 1, "lease"))
                            for name in ("tls", "plain")]
            finally:
                await worker.close()
            return outcomes, plain.requests

    (tls, plain), plain_requests = asyncio.run(scenario())
    assert (tls.status_code, tls.error_code) == (None, "tls_error")
    assert (plain.status_code, plain.error_code, plain_requests) == (200, None, 1)


def test_every_outbound_client_reaches_the_network_through_asyncio_streams_with_one_ssl_context():
    # The transport replaces httpx's pool; should an httpx release build it elsewhere, this says so.
    # The verifying SSL context is made once per process (loading the CA bundle is about 30 ms of
    # CPU): a client made per request, as a subscription preview's, shares it.
    async def scenario():
        async with outbound_client() as first, outbound_client() as second:
            return [(c._transport._pool._network_backend, c._transport._pool._ssl_context) for c in (first, second)]

    (backend, context), (other_backend, other_context) = asyncio.run(scenario())
    assert isinstance(backend, AsyncioBackend) and isinstance(other_backend, AsyncioBackend)
    assert context is other_context and context.verify_mode == ssl.CERT_REQUIRED
