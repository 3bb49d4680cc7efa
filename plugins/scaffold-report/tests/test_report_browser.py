"""The report in a real browser: headless Chromium (the system's, driven by Playwright) opens report.html from
disk. No console errors, the charts render, the browser's filters work, and a screenshot is written.

Needs the Debian package ``chromium`` (``make setup`` installs it when run as root) and the ``playwright``
wheel (the test extra; its driver is in the wheel, no browser is downloaded). Without them the test fails
in CI (``CI=true``) and is skipped elsewhere.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from scaffold_testkit.engines import ScriptedEngine

from scaffold_report.build import build_report

CHROMIUM = Path(os.environ.get("SCAFFOLD_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium")
#: Chromium as root in a container: no sandbox, no GPU, nothing that reaches the network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def need_browser():
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright wheel (pip install -e '.[test]')")
    if not CHROMIUM.is_file():
        missing.append(f"Chromium at {CHROMIUM} (apt-get install chromium, or make setup as root)")
    if missing:
        message = "the browser test needs " + " and ".join(missing)
        if in_ci:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def page(eval_dir, dice_plugins, tmp_path):
    """(the report of the eval fixture opened in headless Chromium, the errors it logged)."""
    need_browser()
    from playwright.sync_api import sync_playwright

    out = tmp_path / "run"
    shutil.copytree(eval_dir, out)
    path = build_report(out, tokenizer=ScriptedEngine().tokenizer, registry=dice_plugins.registry)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=60_000)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            tab.set_default_timeout(15_000)
            tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            tab.on("pageerror", lambda e: errors.append(str(e)))
            tab.on("request", lambda r: errors.append(f"request {r.url}") if not r.url.startswith("file:") else None)
            tab.goto(path.as_uri())
            yield tab, errors
        finally:
            browser.close()


def test_report_opens_offline_with_charts_and_no_errors(page, tmp_path):
    tab, errors = page
    assert tab.locator("svg.chart").count() >= 6
    assert tab.locator("svg.chart rect.bar").count() > 0 and tab.locator("svg.chart path.line").count() >= 4
    box = tab.locator("svg.chart").first.bounding_box()
    assert box and box["width"] > 200 and box["height"] > 100  # laid out, not collapsed
    assert tab.locator("#list .row").count() == 48  # 12 problems x 4 answers
    assert tab.locator("#detail .tokens .t").count() > 0  # the first trajectory is shown token by token
    shot = tmp_path / "report.png"
    tab.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000
    print(f"screenshot: {shot}")
    assert errors == []


def test_filtering_to_reward_zero_shows_only_such_trajectories(page):
    tab, errors = page
    total = tab.locator("#list .row").count()
    tab.select_option("#f-reward", "0")
    rewards = tab.locator("#list .row").evaluate_all("rows => rows.map(r => r.dataset.reward)")
    assert rewards and set(rewards) == {"0"} and len(rewards) < total
    assert tab.locator("#f-count").inner_text().startswith(f"{len(rewards)} of {total}")
    tab.select_option("#f-reward", ">0")
    assert set(tab.locator("#list .row").evaluate_all("rows => rows.map(r => r.dataset.reward)")) == {"1"}
    tab.select_option("#f-reward", "")
    tab.select_option("#f-finish", "length")
    finishes = tab.locator("#list .row").evaluate_all("rows => rows.map(r => r.dataset.finish)")
    assert finishes and set(finishes) == {"length"}
    tab.select_option("#f-finish", "")
    tab.select_option("#f-branch", "branch 2")
    assert set(tab.locator("#list .row").evaluate_all("rows => rows.map(r => r.dataset.branch)")) == {"branch 2"}
    assert errors == []


def test_hover_shows_logprob_and_version_and_hostile_text_stays_text(page):
    tab, errors = page
    tab.fill("#f-search", "sum-01")
    tab.locator("#list .row").first.click()
    token = tab.locator("#detail .tokens .t").first
    token.hover()
    tip = tab.locator("#tip")
    assert tip.is_visible()
    text = tip.inner_text()
    assert "logprob" in text and "weight version 0" in text and "id " in text
    tab.locator("#detail details.prompt summary").click()
    assert "</script><script>window.hacked=1</script>" in tab.locator("#detail details.prompt pre").inner_text()
    assert tab.evaluate("window.hacked === undefined")
    assert errors == []


def test_the_report_opens_at_its_summary_not_scrolled_to_the_trajectories(page, tmp_path):
    tab, errors = page
    tab.wait_for_load_state("load")
    assert tab.evaluate("window.scrollY") == 0  # the first trajectory is selected without moving the window
    summary = tab.locator("#summary").bounding_box()
    assert summary is not None and summary["y"] < 1000  # in view on open
    shot = tmp_path / "top.png"
    tab.screenshot(path=str(shot))  # the viewport as the user sees it on open
    assert shot.stat().st_size > 5_000
    tab.evaluate("document.getElementById('list').focus({preventScroll: true})")
    for _ in range(30):  # keyboard moves deep into the list scroll the list pane, not the page
        tab.keyboard.press("j")
    assert tab.evaluate("window.scrollY") == 0
    assert tab.evaluate("document.getElementById('list').scrollTop") > 0
    assert errors == []


def test_a_training_runs_browser_filters_by_step_and_shows_each_samples_training_state(test_plugins, tmp_path):
    need_browser()
    from playwright.sync_api import sync_playwright

    from scaffold_core.cli import main

    config = tmp_path / "train.yaml"
    config.write_text("task: {name: arithmetic, count: 2}\nengine: {name: benchmark_canned, response: '42'}\n"
                      "trainer: {name: rollout_only, steps: 3, group: 2}\n")
    assert main(["train", str(config), "-o", str(tmp_path / "t"), "--no-progress"]) == 0
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=60_000)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            tab.set_default_timeout(15_000)
            tab.on("pageerror", lambda e: errors.append(str(e)))
            tab.goto((tmp_path / "t" / "report.html").as_uri())
            total = tab.locator("#list .row").count()
            tab.select_option("#f-step", "2")
            steps = tab.locator("#list .row").evaluate_all("rows => rows.map(r => r.dataset.step)")
            assert steps and set(steps) == {"2"} and len(steps) < total
            first = tab.locator("#list .row").first
            assert "step 2" in first.inner_text() and "adv " in first.inner_text()
            first.click()
            detail = tab.locator("#detail").inner_text()
            assert "optimizer step" in detail and "GRPO group" in detail and "advantage" in detail
            assert "training" in detail and ("used" in detail or "left out" in detail)
            assert "refill round" in tab.locator("#trajectories").inner_text()  # the ids are explained
        finally:
            browser.close()
    assert errors == []


def test_the_time_section_draws_the_timeline(page):
    tab, errors = page
    assert tab.locator('nav.top a[href="#time"]').count() == 1
    gantt = tab.locator("#time svg.gantt")
    box = gantt.bounding_box()
    assert box and box["width"] > 600 and box["height"] > 100
    spans = tab.locator("#time svg.gantt rect.span")
    assert spans.count() > 0 and spans.first.bounding_box()["width"] > 0
    assert tab.locator("#time svg.chart polygon.area").count() > 0  # spans in flight by phase
    assert tab.locator("#time table.shares tbody tr").count() >= 2  # each phase's share
    assert errors == []


def test_the_selected_trajectory_shows_its_episodes_spans(page):
    tab, errors = page
    tab.locator("#list .row").nth(5).click()
    spans = tab.locator("#detail .episode-spans")
    assert spans.count() == 1 and spans.locator("h4").inner_text().startswith("time: ")
    assert spans.locator('.span-lane[data-phase="generate"]').count() == 1  # one lane per phase
    assert spans.locator('.span-lane[data-phase="verify"]').count() == 1
    bars = spans.locator(".span-bar")
    assert bars.count() >= 5  # each of the episode's 4 answers' requests, and its verification
    box = bars.first.bounding_box()
    assert box and box["width"] > 0 and box["height"] > 0
    assert "generate" in bars.first.get_attribute("title") or "queued" in bars.first.get_attribute("title")
    rows = spans.locator("table.span-table tr[data-phase]")
    assert rows.count() == bars.count()  # and listed, each with its start and duration
    cells = rows.first.locator("td").all_inner_texts()
    assert cells[2].startswith("+") and cells[3].endswith("s")
    assert "%" in spans.locator(".span-shares").inner_text()  # each phase's share of the episode's time
    assert errors == []


def test_a_comparison_page_opens_with_its_charts_and_no_errors(eval_dir, dice_plugins, tmp_path):
    need_browser()
    from playwright.sync_api import sync_playwright

    from scaffold_report.compare import build_comparison

    first, second = tmp_path / "first", tmp_path / "second"
    shutil.copytree(eval_dir, first)
    shutil.copytree(eval_dir, second)
    path = build_comparison([first, second], output=tmp_path / "c.html", registry=dice_plugins.registry)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=60_000)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            tab.on("pageerror", lambda e: errors.append(str(e)))
            tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            tab.goto(path.as_uri())
            assert tab.locator("svg.chart").count() >= 5
            assert tab.locator("#scaling svg.chart path.line").count() == 4  # pass@k and majority@k, two runs each
            assert tab.locator("#summary table tbody tr").count() == 2
        finally:
            browser.close()
    assert errors == []
