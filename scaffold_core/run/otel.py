"""Episodes' spans as OpenTelemetry traces, for people with a tracing backend (the optional extra ``otel``).

Turned on by ``output.otel: true``, or by the standard environment variables
(``OTEL_TRACES_EXPORTER`` other than ``none``, ``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). Each finished episode becomes one
trace: a span ``episode`` (its id, index, status, attempts, error component)
with a child span per recorded span (``scaffold.phase``, and the name of a
tool call), on the wall clock of when they happened.

Where they go: the tracer provider the process already set (a user's own
set-up, ``opentelemetry-instrument``), else one made here with the exporter
``OTEL_TRACES_EXPORTER`` names: ``otlp`` (the default; needs
``opentelemetry-exporter-otlp``, configured by the usual ``OTEL_EXPORTER_OTLP_*``
variables) or ``console``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..episode import EpisodeResult
from ..errors import ConfigError, require_module
from ..spans import clock

ENV_VARS = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def wanted(option: bool | None, environ: Any = None) -> bool:
    """Whether to export: ``output.otel`` when set, else whether an OTEL_* variable asks for traces."""
    if option is not None:
        return bool(option)
    env = os.environ if environ is None else environ
    exporter = (env.get("OTEL_TRACES_EXPORTER") or "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _provider() -> tuple[Any, bool]:
    """(the tracer provider to use, whether it was made here and is ours to shut down)."""
    require_module("opentelemetry.sdk.trace", needed_by="OpenTelemetry export (output.otel or OTEL_* variables)",
                   what="the OpenTelemetry SDK", install="pip install 'scaffold-core[otel]'")
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):  # the process set one up: its exporters, its resource
        return current, False
    name = (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")[0].strip().lower()
    if name == "console":
        exporter: Any = ConsoleSpanExporter()
    elif name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            except ImportError:
                raise ConfigError("OpenTelemetry export over OTLP needs its exporter: pip install "
                                  "opentelemetry-exporter-otlp (or set OTEL_TRACES_EXPORTER=console)") from None
        exporter = OTLPSpanExporter()
    else:
        raise ConfigError(f"OTEL_TRACES_EXPORTER={name!r}: scaffold exports to otlp or console; set one of them, "
                          "or set up a tracer provider yourself before the run")
    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME")
                                                        or "scaffold"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider, True


class EpisodeTraces:
    """Sends each finished episode's spans as one trace (see the module's docstring)."""

    def __init__(self, clock_zero: float, provider: Any = None):
        """``clock_zero``: the :func:`~scaffold_core.spans.clock` reading the spans count from; ``provider``: a
        tracer provider (default: the process's, else one made from the OTEL_* variables)."""
        owned = False
        if provider is None:
            provider, owned = _provider()
        self.provider, self._owned = provider, owned
        self.tracer = provider.get_tracer("scaffold")
        # the wall clock, in ns, at clock_zero
        self.zero_ns = time.time_ns() - int((clock() - clock_zero) * 1e9)

    def _ns(self, seconds: float) -> int:
        return self.zero_ns + int(seconds * 1e9)

    def export(self, result: EpisodeResult) -> None:
        if result.spans is None:
            return
        from opentelemetry import trace

        started = result.started_s or 0.0
        begin = min([started, *(float(s[1]) for s in result.spans)])
        attributes = {"scaffold.episode_id": result.episode_id, "scaffold.index": result.index,
                      "scaffold.status": result.status, "scaffold.attempts": result.attempts}
        if result.error_component:
            attributes["scaffold.error_component"] = result.error_component
        root = self.tracer.start_span("episode", start_time=self._ns(begin), attributes=attributes)
        context = trace.set_span_in_context(root)
        for item in result.spans:
            phase = str(item[0])
            attrs = {"scaffold.phase": phase, "scaffold.episode_id": result.episode_id}
            if len(item) > 3 and item[3]:
                attrs["scaffold.name"] = str(item[3])
            child = self.tracer.start_span(phase, context=context, start_time=self._ns(float(item[1])),
                                           attributes=attrs)
            child.end(end_time=self._ns(float(item[2])))
        if not result.ok:
            root.set_status(trace.Status(trace.StatusCode.ERROR, (result.error or "")[:200]))
        last = max([started + result.wall_s, *(float(s[2]) for s in result.spans)])  # spans are kept to 0.1 ms
        root.end(end_time=self._ns(last))

    def close(self) -> None:
        """Send what is buffered; shut down the provider when it was made here."""
        try:
            self.provider.force_flush()
        finally:
            if self._owned:
                self.provider.shutdown()
