"""The remote-engine layer: what every engine that generates on inference servers over HTTP shares.

The SGLang and vLLM engine plugins subclass
:class:`~scaffold_remote.engine.RemoteEngine` and write only their
protocol; the rest lives here once, as plugin-facing machinery:

* :mod:`.engine`: ``RemoteEngine``: lifecycle (given URLs or launched
  servers), readiness, the tokenizer, routing, weight versions per token,
  and partial rollouts across a weight update (pause, load, resume;
  requests a pause aborts are continued from their tokens);
* :mod:`.client`: ``RemoteClient`` (the connection pools, retries with
  backoff inside one call, control calls on every server) and the
  ``WireProtocol`` a plugin implements;
* :mod:`.http`: the lean HTTP/1.1 keep-alive connection pool;
* :mod:`.servers`: server URLs (IPv6 and zone ids), least-loaded routing
  with one episode per server, cool-down of failing servers;
* :mod:`.launcher`: starting servers on ports from the worker's slice, their
  logs, readiness and stopping (a plugin writes a ``ServerSpec``);
* :mod:`.tokenizer`: the client-side tokenizer (GGUF, hub id, directory).

Nothing here is imported by ``scaffold list-plugins`` or a run that uses no
server engine.
"""
