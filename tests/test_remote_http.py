"""The remote engines' connection pool against scripted loopback servers: framing, reuse, limits, timeouts, failures."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import socket
import ssl
import subprocess
import time

import pytest
from scaffold_remote.http import (
    CannotConnect,
    ConnectionPool,
    ConnectTimeout,
    Endpoint,
    MalformedResponse,
    RequestTimeout,
    ServerDisconnected,
)


def run(coro, timeout: float = 60.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (
        extra, len(body), body)


@contextlib.asynccontextmanager
async def scripted(answer, tls: ssl.SSLContext | None = None):
    """A loopback server: reads each request (head + Content-Length body) and lets ``answer(writer, head, body)``
    reply; ``answer`` returns False to close the connection. Yields (url, record)."""
    record = {"connections": 0, "requests": [], "open": 0, "most_open": 0}
    writers: set[asyncio.StreamWriter] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        record["connections"] += 1
        record["open"] += 1
        record["most_open"] = max(record["most_open"], record["open"])
        writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"content-length: *(\d+)", head.lower()).group(1))
                body = await reader.readexactly(length)
                record["requests"].append((head, body))
                keep = await answer(writer, head, body)
                await writer.drain()
                if keep is False:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the test ended with this handler still waiting
        finally:
            record["open"] -= 1
            writers.discard(writer)
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}", record
    finally:
        server.close()
        for writer in list(writers):
            writer.transport.abort()
        await server.wait_closed()


def pool(**kw) -> ConnectionPool:
    kw.setdefault("limit", 8)
    kw.setdefault("request_timeout", 10.0)
    kw.setdefault("connect_timeout", 5.0)
    kw.setdefault("headers", {"Content-Type": "application/json"})
    return ConnectionPool(**kw)


async def send_all(url: str, bodies: list[bytes], **kw) -> tuple[list, ConnectionPool]:
    p = pool(**kw)
    try:
        ep = p.endpoint(url, "/generate")
        results = [await p.request(ep, b) for b in bodies]
    finally:
        await p.close()
    return results, p


def test_the_request_is_one_post_with_the_prebuilt_head_and_keep_alive_reuses_the_connection():
    async def answer(writer, head, body):
        writer.write(ok(b'{"echo":%s}' % body))

    async def main():
        async with scripted(answer) as (url, record):
            results, _ = await send_all(url, [b'{"a":1}', b'{"b":2}', b'{"c":3}'])
            return url, results, record

    url, results, record = run(main())
    assert results == [(200, b'{"echo":{"a":1}}'), (200, b'{"echo":{"b":2}}'), (200, b'{"echo":{"c":3}}')]
    assert record["connections"] == 1  # one keep-alive connection for all three
    head, body = record["requests"][0]
    assert head == (b"POST /generate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 7\r\n\r\n" % url.split("//")[1].encode())
    assert body == b'{"a":1}'


@pytest.mark.parametrize("cut", [5, 20, 50, 61, 62, 63, 64, 70])
def test_an_answer_split_anywhere_across_reads_is_framed(cut):
    payload = b'{"output_ids":[1,2,3],"x":"' + b"y" * 40 + b'"}'
    whole = ok(payload)

    async def answer(writer, head, body):
        writer.write(whole[:cut])
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(whole[cut:])

    async def main():
        async with scripted(answer) as (url, record):
            results, _ = await send_all(url, [b"{}", b"{}"])
            return results, record

    results, record = run(main())
    assert results == [(200, payload)] * 2 and record["connections"] == 1


def test_chunked_answers_with_extensions_and_trailers_are_joined_and_the_connection_reused():
    async def answer(writer, head, body):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"1\r\n \r\n5\r\nwor")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"ld\r\n0\r\nX-Trailer: t\r\n\r\n")

    async def main():
        async with scripted(answer) as (url, record):
            results, _ = await send_all(url, [b"{}", b"{}"])
            return results, record

    results, record = run(main())
    assert results == [(200, b"hello world")] * 2 and record["connections"] == 1


def test_an_answer_without_a_length_ends_at_close_and_its_connection_is_not_reused():
    async def answer(writer, head, body):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"partial\":")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"true}")
        return False

    async def main():
        async with scripted(answer) as (url, record):
            results, _ = await send_all(url, [b"{}", b"{}"])
            return results, record

    results, record = run(main())
    assert results == [(200, b'{"partial":true}')] * 2 and record["connections"] == 2


@pytest.mark.parametrize("split", [False, True])
def test_interim_answers_are_skipped(split):
    async def answer(writer, head, body):
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if split:
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + ok(b"final"))

    async def main():
        async with scripted(answer) as (url, record):
            results, _ = await send_all(url, [b"{}", b"{}"])
            return results, record

    results, record = run(main())
    assert results == [(200, b"final")] * 2 and record["connections"] == 1


@pytest.mark.parametrize("response", [
    ok(b"x", b"Connection: close\r\n"),
    b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
])
def test_connection_close_and_http_1_0_answers_are_not_reused(response):
    async def answer(writer, head, body):
        writer.write(response)

    async def main():
        async with scripted(answer) as (url, record):
            results, _ = await send_all(url, [b"{}", b"{}"])
            return results, record

    results, record = run(main())
    assert results == [(200, b"x")] * 2 and record["connections"] == 2


def test_error_statuses_and_empty_bodies_come_back_as_they_are():
    answers = iter([b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy",
                    b"HTTP/1.1 204 No Content\r\n\r\n", ok(b"")])

    async def answer(writer, head, body):
        writer.write(next(answers))

    async def main():
        async with scripted(answer) as (url, record):
            results, _ = await send_all(url, [b"{}", b"{}", b"{}"])
            return results, record

    results, record = run(main())
    assert results == [(503, b"busy"), (204, b""), (200, b"")] and record["connections"] == 1


@pytest.mark.parametrize("sent", [b"", b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345"])
def test_a_connection_closed_before_the_full_answer_fails_as_server_disconnected(sent):
    async def answer(writer, head, body):
        writer.write(sent)
        return False

    async def main():
        async with scripted(answer) as (url, _):
            with pytest.raises(ServerDisconnected, match=f"{len(sent)} bytes received"):
                await send_all(url, [b"{}"])

    run(main())


@pytest.mark.parametrize("garbage", [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n",
                                     b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
                                     b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"])
def test_bytes_that_are_not_an_http_answer_are_a_malformed_response(garbage):
    async def answer(writer, head, body):
        writer.write(garbage)

    async def main():
        async with scripted(answer) as (url, _):
            with pytest.raises(MalformedResponse):
                await send_all(url, [b"{}"])

    run(main())


def test_at_most_limit_requests_hold_connections_and_the_rest_wait_in_arrival_order():
    order: list[bytes] = []

    async def answer(writer, head, body):
        await asyncio.sleep(0.05)
        order.append(body)
        writer.write(ok(body))

    async def main():
        async with scripted(answer) as (url, record):
            p = pool(limit=2)
            try:
                ep = p.endpoint(url, "/generate")
                results = await asyncio.gather(*(p.request(ep, b"%d" % i) for i in range(6)))
            finally:
                await p.close()
            return results, record

    results, record = run(main())
    assert results == [(200, b"%d" % i) for i in range(6)]
    assert record["most_open"] == 2 and record["connections"] == 2
    assert order[:2] in ([b"0", b"1"], [b"1", b"0"]) and order[2:4] in ([b"2", b"3"], [b"3", b"2"])


def test_a_request_past_request_timeout_fails_and_its_connection_and_slot_are_freed():
    hang = asyncio.Event()

    async def answer(writer, head, body):
        if body == b"hang":
            await hang.wait()
        writer.write(ok(body))

    async def main():
        async with scripted(answer) as (url, record):
            p = pool(limit=1, request_timeout=0.3)
            try:
                ep = p.endpoint(url, "/generate")
                start = time.monotonic()
                with pytest.raises(RequestTimeout):
                    await p.request(ep, b"hang")
                took = time.monotonic() - start
                after = await p.request(ep, b"fine")  # the slot is free again; a new connection is opened
                hang.set()
            finally:
                await p.close()
            return took, after, record

    took, after, record = run(main())
    assert 0.3 <= took < 1.0 and after == (200, b"fine") and record["connections"] == 2


def test_a_request_can_set_its_own_timeout_shorter_or_longer_than_the_pools():
    """Control calls (a health probe, a weight update) set their own bound; the pool's default is untouched."""
    release = asyncio.Event()

    async def answer(writer, head, body):
        if body == b"slow":
            await asyncio.sleep(0.5)
        elif body == b"hang":
            await release.wait()
        writer.write(ok(body))

    async def main():
        async with scripted(answer) as (url, record):
            p = pool(limit=4, request_timeout=0.3)
            try:
                ep = p.endpoint(url, "/control")
                start = time.monotonic()
                with pytest.raises(RequestTimeout):
                    await p.request(ep, b"hang", 0.05)
                short = time.monotonic() - start
                longer = await p.request(ep, b"slow", 5.0)  # past the pool's 0.3 s, within its own 5 s
                with pytest.raises(RequestTimeout):
                    await p.request(ep, b"slow")  # the pool's own bound still applies to the others
                release.set()
            finally:
                await p.close()
            return short, longer

    short, longer = run(main())
    assert short < 0.3 and longer == (200, b"slow")


def test_waiting_for_a_free_connection_counts_toward_request_timeout():
    async def answer(writer, head, body):
        await asyncio.sleep(0.4)  # each answer alone is well within the 0.6 s request timeout
        writer.write(ok(body))

    async def main():
        async with scripted(answer) as (url, _):
            p = pool(limit=1, request_timeout=0.6)
            try:
                ep = p.endpoint(url, "/generate")
                first = asyncio.ensure_future(p.request(ep, b"1"))
                await asyncio.sleep(0.1)
                start = time.monotonic()
                with pytest.raises(RequestTimeout):  # waits 0.3 s for the connection, then 0.4 s for its answer
                    await p.request(ep, b"2")
                return await first, time.monotonic() - start
            finally:
                await p.close()

    first, took = run(main())
    assert first == (200, b"1") and 0.6 <= took < 1.0


def test_a_cancelled_request_frees_its_slot_and_closes_its_connection():
    async def answer(writer, head, body):
        if body == b"slow":
            await asyncio.sleep(5)
        writer.write(ok(body))

    async def main():
        async with scripted(answer) as (url, record):
            p = pool(limit=1)
            try:
                ep = p.endpoint(url, "/generate")
                slow = asyncio.ensure_future(p.request(ep, b"slow"))
                waiting = asyncio.ensure_future(p.request(ep, b"waiting"))
                await asyncio.sleep(0.05)
                waiting.cancel()  # cancelled while waiting for the slot
                slow.cancel()  # cancelled while its answer is pending
                await asyncio.gather(slow, waiting, return_exceptions=True)
                result = await asyncio.wait_for(p.request(ep, b"next"), 2.0)
                await asyncio.sleep(0.05)
                return result, record, p.open_connections
            finally:
                await p.close()

    result, record, open_connections = run(main())
    assert result == (200, b"next") and record["connections"] == 2 and open_connections == 1


def test_opening_a_connection_is_bounded_by_connect_timeout(monkeypatch):
    async def main():
        p = pool(connect_timeout=0.2, request_timeout=10.0)
        loop = asyncio.get_running_loop()

        async def never(*args, **kwargs):
            await asyncio.sleep(30)

        monkeypatch.setattr(loop, "create_connection", never)
        try:
            ep = p.endpoint("http://127.0.0.1:9", "/generate")
            with pytest.raises(ConnectTimeout, match="longer than 0.2 s"):
                await p.request(ep, b"{}")
            short = pool(connect_timeout=5.0, request_timeout=0.2)  # the whole request's budget ends first
            try:
                with pytest.raises(RequestTimeout):
                    await short.request(short.endpoint("http://127.0.0.1:9", "/generate"), b"{}")
            finally:
                await short.close()
        finally:
            await p.close()

    run(main())


def test_a_refused_connection_is_cannot_connect():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connecting is refused

        async def main():
            with pytest.raises(CannotConnect, match=f"127.0.0.1:{port}"):
                await send_all(f"http://127.0.0.1:{port}", [b"{}"])

        run(main())


def test_host_names_are_resolved_once_and_every_address_is_tried(monkeypatch):
    async def answer(writer, head, body):
        writer.write(ok(body))

    async def main():
        async with scripted(answer) as (url, record):
            port = int(url.rsplit(":", 1)[1])
            with socket.socket() as refusing:
                refusing.bind(("127.0.0.2", 0))  # first address: refuses
                lookups = []
                loop = asyncio.get_running_loop()

                async def getaddrinfo(host, port_, **kw):
                    lookups.append(host)
                    await asyncio.sleep(0.01)
                    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port_)),
                            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port_))]

                monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
                p = pool(limit=4)
                try:
                    ep = p.endpoint(f"http://server.test:{port}", "/generate")
                    results = await asyncio.gather(*(p.request(ep, b"%d" % i) for i in range(4)))
                finally:
                    await p.close()
                return results, lookups, record, port

    results, lookups, record, port = run(main())
    assert results == [(200, b"%d" % i) for i in range(4)] and lookups == ["server.test"]
    assert record["requests"][0][0].split(b"\r\n")[1] == b"Host: server.test:%d" % port  # the name, not the IP


def test_idle_connections_are_closed_after_keepalive_and_ones_the_server_closed_are_not_reused():
    async def answer(writer, head, body):
        writer.write(ok(body))
        return body != b"then-close"  # the server closes after this answer, without saying so

    async def main():
        async with scripted(answer) as (url, record):
            p = pool(keepalive_s=0.2)
            try:
                ep = p.endpoint(url, "/generate")
                await p.request(ep, b"a")
                await asyncio.sleep(0.3)  # past keepalive: the idle connection is dropped, a new one opened
                await p.request(ep, b"then-close")
                await asyncio.sleep(0.05)
                third = await p.request(ep, b"c")  # the server closed the idle one: a fresh connection
                await asyncio.sleep(1.3)  # the sweeper closes the idle connection
                return third, record, p.open_connections
            finally:
                await p.close()

    third, record, open_connections = run(main())
    assert third == (200, b"c") and record["connections"] == 3 and open_connections == 0


def test_closing_the_pool_fails_requests_in_flight():
    async def answer(writer, head, body):
        await asyncio.sleep(5)

    async def main():
        async with scripted(answer) as (url, _):
            p = pool()
            pending = asyncio.ensure_future(p.request(p.endpoint(url, "/generate"), b"{}"))
            await asyncio.sleep(0.05)
            await p.close()
            with pytest.raises(ServerDisconnected):
                await pending
            with pytest.raises(ServerDisconnected, match="closed"):
                await p.request(p.endpoint(url, "/generate"), b"{}")

    run(main())


def test_header_values_with_line_breaks_are_refused():
    with pytest.raises(ValueError, match="line break"):
        Endpoint("http://127.0.0.1:1", "/generate", "POST", {"Authorization": "Bearer a\r\nX-Evil: 1"})


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_https_verifies_the_server_certificate(tmp_path, monkeypatch):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def answer(writer, head, body):
        writer.write(ok(body))

    async def main(trusted: bool):
        async with scripted(answer, tls=server_tls) as (url, _):
            if trusted:
                monkeypatch.setenv("SSL_CERT_FILE", str(cert))
            else:
                monkeypatch.delenv("SSL_CERT_FILE", raising=False)
            return await send_all(url, [b"{}", b"{}"])

    results, _ = run(main(True))
    assert results == [(200, b"{}")] * 2
    with pytest.raises(CannotConnect, match="CERTIFICATE_VERIFY_FAILED"):
        run(main(False))
