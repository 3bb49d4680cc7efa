"""Where the time went: every episode records its spans (engine-reported, tool calls, plugins' own), metrics.json
gives each phase's share, workers' shares combine, and OpenTelemetry gets a trace per episode."""

from __future__ import annotations

import asyncio
import json

import pytest
from scaffold_testkit.helpers import SPAN_EPS as EPS
from scaffold_testkit.helpers import check_spans

from scaffold_core.controller import Controller
from scaffold_core.episode import EpisodeContext, Outcome
from scaffold_core.generation import AwaitTask, GenerationResult
from scaffold_core.output.store import read_records
from scaffold_core.run.rollout import Rollout
from scaffold_core.run.runtime import Runtime
from scaffold_core.sampling import SamplingParams
from scaffold_core.spans import PHASES, add_span, clock, exclusive
from scaffold_report.build import build_report


def test_time_divides_among_phases_by_precedence_and_sums_to_the_episode():
    spans = [("decode", 0.0, 4.0), ("verify", 3.0, 5.0), ("weight_wait", 1.0, 2.0), ("queued", -1.0, 0.0)]
    parts = exclusive(spans, -1.0, 6.0)
    assert parts == pytest.approx({"queued": 1.0, "decode": 3.0, "weight_wait": 1.0, "verify": 1.0, "other": 1.0})
    assert sum(parts.values()) == pytest.approx(7.0)
    assert exclusive([("tool", 5.0, 9.0)], 6.0, 8.0) == pytest.approx({"tool": 2.0})  # clipped to the episode
    assert PHASES[0] == "weight_wait"  # a wait for new weights inside a request counts as that wait


def test_the_runs_time_shares_divide_each_episode_as_exclusive_does_sequential_or_overlapping():
    from scaffold_core.episode import EpisodeResult
    from scaffold_core.run.metrics import RunMetrics

    episodes = [  # (started_s, wall_s, spans): one after another; overlapping; a queued wait before the start;
        (1.0, 2.0, [["generate", 1.0, 2.0], ["verify", 2.0, 2.5]]),  # a span past the end, none at all
        (0.0, 4.0, [["decode", 0.0, 3.0], ["weight_wait", 1.0, 2.0], ["tool", 2.5, 3.5, "search"]]),
        (5.0, 1.0, [["queued", 4.0, 5.0], ["generate", 5.0, 5.5], ["verify", 5.5, 9.0]]),
        (7.0, 1.0, []),
    ]
    metrics, expected, total = RunMetrics(), {}, 0.0
    for i, (started, wall, spans) in enumerate(episodes):
        metrics.add(EpisodeResult(episode_id=str(i), index=i, status="ok", reference=None, prompt_text="",
                                  wall_s=wall, spans=spans, started_s=started))
        begin = min([started, *(s[1] for s in spans)])
        total += started + wall - begin
        for phase, seconds in exclusive(spans, begin, started + wall).items():
            expected[phase] = expected.get(phase, 0.0) + seconds
    assert metrics.spanned_s == pytest.approx(total)
    assert dict(metrics.phase_s) == pytest.approx(expected)
    assert expected["weight_wait"] == pytest.approx(1.0) and expected["other"] == pytest.approx(0.5 + 0.5 + 1.0)


def test_a_run_records_spans_within_each_episode_and_metrics_give_the_shares(dice_plugins, dice_config, tmp_path):
    config = dice_config(task={"name": "sums", "count": 8}, controller={"name": "native", "samples": 2})
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=dice_plugins, progress=False).run()
    records = list(read_records(tmp_path / "run"))
    assert len(records) == 8
    for record in records:
        check_spans(record)
        phases = [s[0] for s in record["spans"]]
        assert phases.count("generate") == 2 and "verify" in phases  # one request per sample, then the verifier
    shares = metrics["time_shares"]
    assert set(shares) <= {*PHASES, "other"} and "generate" in shares
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
    assert metrics["episode_time_s"] == pytest.approx(
        sum(r["started_s"] + r["wall_s"] - min(r["started_s"], r["spans"][0][1]) for r in records), abs=2e-3)
    on_disk = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert on_disk["time_shares"] == shares


def test_spans_can_be_turned_off(dice_plugins, dice_config, tmp_path):
    config = dice_config(task={"name": "sums", "count": 3}, output={"spans": False})
    metrics = Rollout(config, output_dir=tmp_path / "run", plugins=dice_plugins, progress=False).run()
    assert all("spans" not in r for r in read_records(tmp_path / "run"))
    assert "time_shares" not in metrics
    html = build_report(tmp_path / "run", tokenizer=None, registry=dice_plugins.registry).read_text()
    assert '<section id="time">' not in html and not (tmp_path / "run" / "trace.json").exists()


class _Timed(Controller):
    """A request on an engine that reports its own spans, a tool call, and a span of the controller's own."""

    def process(self, ctx: EpisodeContext):
        task = ctx.generation_task()
        yield [task]
        began = clock()
        yield [AwaitTask(lambda: asyncio.sleep(0.02), timeout=5.0, component="tool", what="tool 'search'")]
        add_span("await", began, clock(), "controller bookkeeping")
        return Outcome([task])


class _ReportingEngine:
    tokenizer = None

    async def generate(self, request):
        queued = clock()
        await asyncio.sleep(0.01)
        prefilled = clock()
        await asyncio.sleep(0.01)
        done = clock()
        spans = [("queued", queued - 5.0, prefilled - 0.005),  # starts before the call: clipped to it
                 ("prefill", prefilled - 0.005, prefilled), ("decode", prefilled, done)]
        return GenerationResult([1, 2], [0.0, 0.0], "stop", "x", meta={"spans": spans})


def test_engine_reported_spans_tool_calls_and_plugin_spans_are_recorded():
    runtime = Runtime(engine=_ReportingEngine(), controller=_Timed(), verifier=None)
    ctx = EpisodeContext(episode_id="e", index=0, row={}, prompt_ids=[1], sampling=SamplingParams(max_tokens=4),
                         seed=1)
    result = asyncio.run(runtime.run_episode(ctx))
    assert result.ok
    phases = [s[0] for s in result.spans]
    assert phases[:3] == ["queued", "prefill", "decode"]  # the engine's own split of its request
    assert result.spans[0][1] >= result.started_s - EPS  # the engine's early start is clipped to the request
    tool = [s for s in result.spans if s[0] == "tool"]
    assert tool and tool[0][3] == "tool 'search'" and tool[0][2] - tool[0][1] >= 0.015
    assert ["await", "controller bookkeeping"] == [s[0] for s in result.spans if s[0] == "await"] + [
        s[3] for s in result.spans if s[0] == "await"]
    check_spans({"episode_id": "e", "spans": result.spans, "started_s": result.started_s, "wall_s": result.wall_s})
    assert add_span("decode", 0.0, 1.0) is None  # outside an episode: nothing, no error


class _BadSpans(Controller):
    """A plugin's spans with times that are no finite numbers, beside a good one."""

    def process(self, ctx: EpisodeContext):
        task = ctx.generation_task()
        yield [task]
        now = clock()
        add_span("await", float("nan"), now, "nan start")
        add_span("await", now, float("inf"), "infinite end")
        add_span("await", now, 1e308, "an end too far to scale")  # finite, but not once scaled to 0.1 ms
        add_span("await", "soon", now, "a string")  # type: ignore[arg-type]
        add_span("await", now - 0.001, now, "good")
        return Outcome([task])


def test_a_plugins_span_with_a_time_that_is_no_finite_number_is_left_out_and_the_episode_kept(tmp_path):
    from scaffold_core.output.store import STORE, EpisodeStore

    runtime = Runtime(engine=_ReportingEngine(), controller=_BadSpans(), verifier=None)
    ctx = EpisodeContext(episode_id="e", index=0, row={}, prompt_ids=[1], sampling=SamplingParams(max_tokens=4),
                         seed=1)
    result = asyncio.run(runtime.run_episode(ctx))
    assert result.ok and result.attempts == 1
    assert [s[3] for s in result.spans if s[0] == "await"] == ["good"]
    assert [s[0] for s in result.spans][:3] == ["queued", "prefill", "decode"]  # in order of their start
    check_spans({"episode_id": "e", "spans": result.spans, "started_s": result.started_s, "wall_s": result.wall_s})
    (tmp_path / "run").mkdir()
    store = EpisodeStore(tmp_path / "run" / STORE)  # stored as strict JSON: the spans read back as recorded
    store.put([result])
    store.close()
    (record,) = read_records(tmp_path / "run")
    assert record["spans"] == result.spans


# -- runs side by side ----------------------------------------------------------------------------------------


# -- OpenTelemetry ----------------------------------------------------------------------------------------------


def test_opentelemetry_is_asked_for_by_the_option_or_the_standard_variables():
    from scaffold_core.run.otel import wanted

    assert not wanted(None, {})
    assert wanted(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert wanted(None, {"OTEL_TRACES_EXPORTER": "console"}) and not wanted(None, {"OTEL_TRACES_EXPORTER": "none"})
    assert not wanted(False, {"OTEL_TRACES_EXPORTER": "otlp"}) and wanted(True, {})


def test_each_episode_becomes_a_trace_with_a_span_per_phase(dice_plugins, dice_config, tmp_path, monkeypatch):
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from scaffold_core.run import rollout as rollout_module
    from scaffold_core.run.otel import EpisodeTraces

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(rollout_module, "EpisodeTraces", lambda zero: EpisodeTraces(zero, provider))
    config = dice_config(task={"name": "sums", "count": 3}, controller={"name": "native", "samples": 2},
                         output={"otel": True})
    Rollout(config, output_dir=tmp_path / "run", plugins=dice_plugins, progress=False).run()
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.name == "episode"]
    assert sorted(s.attributes["scaffold.episode_id"] for s in roots) == ["sum-00", "sum-01", "sum-02"]
    records = {r["episode_id"]: r for r in read_records(tmp_path / "run")}
    for root in roots:
        children = [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]
        record = records[root.attributes["scaffold.episode_id"]]
        assert [c.name for c in sorted(children, key=lambda c: c.start_time)] == [s[0] for s in record["spans"]]
        assert all(root.start_time <= c.start_time <= c.end_time <= root.end_time + 1000 for c in children)
        assert {c.context.trace_id for c in children} == {root.context.trace_id}


def test_workers_time_shares_combine_as_one_runs():
    from scaffold_core.episode import EpisodeResult
    from scaffold_core.run.metrics import RunMetrics

    def episode(name, spans, started, wall):
        return EpisodeResult(name, 0, "ok", spans=spans, started_s=started, wall_s=wall)

    one, two, both = RunMetrics(), RunMetrics(), RunMetrics()
    first = episode("a", [["generate", 0.0, 3.0], ["verify", 3.0, 4.0]], 0.0, 4.0)
    second = episode("b", [["queued", 1.0, 2.0], ["tool", 2.0, 3.0, "tool 'search'"]], 2.0, 2.0)
    one.add(first)
    two.add(second)
    both.add(first)
    both.add(second)
    combined = RunMetrics.from_states([one.state(), two.state()]).summary()
    assert combined["time_shares"] == both.summary()["time_shares"]
    assert combined["episode_time_s"] == 7.0  # 4 s, and 3 s from the second's wait for its turn
    assert combined["time_shares"] == pytest.approx({"generate": 3 / 7, "verify": 1 / 7, "queued": 1 / 7,
                                                     "tool": 1 / 7, "other": 1 / 7}, abs=1e-4)
