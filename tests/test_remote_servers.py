"""The shared remote-engine layer's server handling: URLs (IPv6, zone ids), balancing, error bodies."""

from __future__ import annotations

import pytest
from scaffold_remote.client import error_message
from scaffold_remote.http import Endpoint
from scaffold_remote.servers import ServerPool, normalize_url, parse_urls


@pytest.mark.parametrize("status, body, message", [
    (400, '{"error":{"message":"top_p must be in (0, 1], got 1.5."}}', "top_p must be in (0, 1], got 1.5."),
    (400, '{"error": "unknown field `seed`, expected one of `max_new_tokens`, `stop`"}', "unknown field `seed`"),
    (503, '{"object":"error","message":"The request queue is full.","type":"503","param":null,"code":503}',
     "The request queue is full."),
    (500, "Internal Server Error", "Internal Server Error"),
    (400, '{"success": false, "message": "Failed to get weights iterator: qwen/qwen2.5-0.5b-instruct-wrong '
          '(repository not found)."}', "Failed to get weights iterator"),
    (401, '{"error": "Unauthorized"}', "Unauthorized"),
    (400, "", "(empty body)"),
    (422, '{"detail": [{"loc": ["body", "token_ids"], "msg": "Field required"}]}', "Field required"),
    (404, '{"detail": "Not Found"}', "Not Found"),
    (400, '{"error": {"message": "max_tokens must be at least 1, got 0.", "type": "BadRequestError", '
          '"param": "max_tokens", "code": 400}}', "max_tokens must be at least 1"),
])
def test_error_bodies_in_every_shape_servers_send(status, body, message):
    text = error_message(status, body.encode())
    assert text.startswith(f"HTTP {status}: ") and message in text


# -- server URLs and balancing ------------------------------------------------------------------


@pytest.mark.parametrize("given, expected", [
    ("http://127.0.0.1:30000", "http://127.0.0.1:30000"),
    ("http://127.0.0.1:30000/", "http://127.0.0.1:30000"),
    ("127.0.0.1:30000", "http://127.0.0.1:30000"),
    ("http://[::1]:30000", "http://[::1]:30000"),
    ("[::1]:30000", "http://[::1]:30000"),
    ("https://node-3.cluster:8443", "https://node-3.cluster:8443"),
    ("http://[fe80::1%25eth0]:8000", "http://[fe80::1%25eth0]:8000"),  # a zone id (RFC 6874), its case kept
    ("[fe80::1%Eth1]:8000", "http://[fe80::1%25Eth1]:8000"),
])
def test_urls_are_normalized_with_ipv6_bracketed(given, expected):
    assert normalize_url(given) == expected


@pytest.mark.parametrize("bad, fix", [
    ("::1:30000", r"http://\[addr\]:port"), ("http://::1:30000", r"\[addr\]:port"), ("http://host", "no port"),
    ("http://host:30000/generate", "base URL"), ("ftp://host:1", "http or https"), ("http://host:99999", "port"),
])
def test_bad_urls_name_the_fix(bad, fix):
    with pytest.raises(ValueError, match=fix):
        normalize_url(bad)


def test_url_lists():
    assert parse_urls("http://a:1, http://b:2") == ["http://a:1", "http://b:2"]
    assert parse_urls(["a:1", "b:2"]) == ["http://a:1", "http://b:2"]
    with pytest.raises(ValueError, match="twice"):
        parse_urls(["a:1", "http://a:1/"])


def test_pool_balances_by_in_flight_and_keeps_episodes_on_one_server():
    pool = ServerPool(["http://a:1", "http://b:2", "http://c:3"])
    a, b, c = pool.servers
    a.in_flight, b.in_flight, c.in_flight = 5, 1, 3
    assert pool.pick("ep-1") is b
    b.in_flight = 10  # the episode stays on its server even when it becomes busier
    assert pool.pick("ep-1") is b
    assert pool.pick("ep-2") is c
    assert pool.pick(None) is c  # no episode: least in flight
    assert pool.mark_down(b) == 1.0 and pool.mark_down(b) == 2.0  # doubling cool-down
    moved = pool.pick("ep-1")
    assert moved is c and pool.episode_server("ep-1") is c  # a down server's episodes move, and stay moved
    pool.mark_up(b)
    assert pool.pick("ep-1") is c


def test_pool_forgets_oldest_episodes_beyond_its_limit():
    pool = ServerPool(["http://a:1", "http://b:2"], sticky_limit=3)
    for i in range(5):
        pool.pick(f"ep-{i}")
    assert pool.episode_server("ep-0") is None and pool.episode_server("ep-4") is not None


def test_pool_without_stickiness_balances_every_request():
    pool = ServerPool(["http://a:1", "http://b:2"], sticky=False)
    a, b = pool.servers
    a.in_flight = 1
    assert pool.pick("ep") is b
    b.in_flight = 2
    assert pool.pick("ep") is a


def test_a_zone_id_reaches_the_socket_raw_and_the_host_header_encoded():
    endpoint = Endpoint(normalize_url("http://[fe80::1%25eth0]:8000"), "/generate", "POST", {})
    assert endpoint.host == "fe80::1%eth0"  # what getaddrinfo and connect need
    assert endpoint.addresses is None  # resolved (to the interface's index) when first used
    assert b"Host: [fe80::1%25eth0]:8000\r\n" in endpoint.head
