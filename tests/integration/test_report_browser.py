"""The reports as a person sees them: rendered by a real headless Chromium.

A small real lake (test_audit_pipeline's store and ledgers, ingested and audited) gets its
audit report and DLQ report from `mqaudit pipeline report` / `dlq-report`; each page must
load with no console error, exception or failed load, every plot must decode to a non-empty
image, and the screenshot must show the plots (their areas are not blank).

The Great Expectations Data Docs of the same lake (`mqaudit pipeline validate`) are loaded
in a Chromium that resolves no host name, as on a host without internet: the index must
list every validation and each page must render its tables from the scripts served from
the docs folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image, ImageStat
from pyspark.sql import SparkSession

from broker_runtime.cli.main import main
from expectations.offline_docs import CDN_FILES, missing_assets
from pipeline.jobs.audit import run_audit
from pipeline.jobs.ingest import run_ingest
from pipeline.lake import AUDIT_TABLES
from pipeline.reports.audit_report import render_report
from tests.browser import Browser, PageLoad, chromium, chromium_binary
from tests.conftest import local_spark
from tests.integration.audit_data import build_data_dir

# The lake's ingest, gates, audit and report: about 2 minutes idle, 6 at a load of 20.
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]

# Grey-level variance of a rendered area: 0 for a blank one. These reports' plots give
# about 900 (a few points on axes) to 6,000 (filled bars), their whole pages over 3,000.
MIN_PLOT_VARIANCE = 300.0
MIN_PAGE_VARIANCE = 100.0


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    chromium_binary()  # skip before building a lake when there is no Chromium
    with chromium(tmp_path_factory.mktemp("chromium")) as b:
        yield b


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    chromium_binary()
    spark: SparkSession = local_spark()
    root = tmp_path_factory.mktemp("reports")
    lake = root / "lake"
    run_ingest(build_data_dir(root), lake, spark, progress=False)
    run_audit(lake, spark, progress=False)
    docs = root / "docs"
    assert main(["pipeline", "validate", "--lake", str(lake), "--docs", str(docs), "--quiet"]) == 0
    report = ["pipeline", "report", "--lake", str(lake), "--out", str(root / "audit")]
    assert main([*report, "--docs", str(docs)]) == 0
    assert main(["pipeline", "dlq-report", "--lake", str(lake), "--out", str(root / "dlq")]) == 0
    return {
        "audit": root / "audit" / "audit_report.html",
        "dlq": root / "dlq" / "dlq_report.html",
        "docs": docs,
    }


def _variance(image: Image.Image) -> float:
    return float(ImageStat.Stat(image.convert("L")).var[0])


def _assert_shows_its_plots(page: PageLoad, plots: int) -> None:
    assert page.problems == [], page.problems
    assert len(page.plots) == plots, page.plots
    for plot in page.plots:
        assert plot["complete"] and plot["natural_w"] > 0 and plot["natural_h"] > 0, plot
    assert page.screenshot is not None
    with Image.open(page.screenshot) as shot:
        assert _variance(shot) > MIN_PAGE_VARIANCE
        for plot in page.plots:
            box = (plot["x"], plot["y"], plot["x"] + plot["w"], plot["y"] + plot["h"])
            assert plot["w"] > 100 and plot["h"] > 100, plot  # laid out at a readable size
            area = shot.crop(tuple(round(v) for v in box))
            assert _variance(area) > MIN_PLOT_VARIANCE, (plot["src"], _variance(area))


def test_audit_report_loads_cleanly_and_shows_its_plots(
    browser: Browser, reports: dict[str, Path], tmp_path: Path
) -> None:
    page = browser.load(reports["audit"], tmp_path / "audit_report.png")
    _assert_shows_its_plots(page, plots=3)
    names = sorted(Path(p["src"]).name for p in page.plots)
    # One consumer offset snapshot in this lake: no lag over time to draw, a sentence says so.
    assert names == [
        "dead_letters_by_group_age.png",
        "duplicates_by_cause.png",
        "losses_by_cause.png",
    ]
    html = reports["audit"].read_text()
    assert "One consumer offset snapshot so far" in html


# In the table holding message M000: rows visible, then filtered by "M05", then page 2.
_PAGING = """JSON.stringify((() => {
  const t = [...document.querySelectorAll('table.paged')].find(t => t.textContent.includes('M000'));
  const visible = () => [...t.tBodies[0].rows].filter(r => !r.hidden).length;
  const bar = t.previousElementSibling, input = bar.querySelector('input');
  const first = visible();
  input.value = 'M05';
  input.dispatchEvent(new Event('input'));
  const filtered = visible(), filtered_info = bar.querySelector('span').textContent;
  input.value = '';
  input.dispatchEvent(new Event('input'));
  bar.querySelectorAll('button')[1].click();
  return {first, filtered, filtered_info, second: visible(),
          info: bar.querySelector('span').textContent};
})())"""


def test_long_tables_are_paged_and_filterable(browser: Browser, tmp_path: Path) -> None:
    empty = {name: pd.DataFrame(columns=s.fieldNames()) for name, s in AUDIT_TABLES.items()}
    dup = pd.DataFrame(
        [
            {"kind": "stored_twice", "cause": "producer_resend", "msg_id": f"M{i:03d}",
             "count": 2, "topic": "TopicA", "as_of_ms": 1}
            for i in range(60)
        ],
        columns=AUDIT_TABLES["audit_duplicates"].fieldNames(),
    )  # fmt: skip
    result = render_report({**empty, "audit_duplicates": dup}, tmp_path / "paged")
    page = browser.load(Path(result["html"]), tmp_path / "paged.png", probe=_PAGING)
    assert page.problems == [], page.problems
    assert page.probed == {
        "first": 25,
        "filtered": 10,
        "filtered_info": "rows 1-10 of 10 (filtered from 60)",
        "second": 25,
        "info": "rows 26-50 of 60",
    }


def test_dlq_report_loads_cleanly_and_shows_its_plot(
    browser: Browser, reports: dict[str, Path], tmp_path: Path
) -> None:
    page = browser.load(reports["dlq"], tmp_path / "dlq_report.png")
    _assert_shows_its_plots(page, plots=1)


def test_the_browser_check_sees_errors_and_missing_plots(browser: Browser, tmp_path: Path) -> None:
    """The same checks on a page with each fault: none goes unseen."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><body><h1>broken</h1>"
        '<img src="missing.png" alt="a plot that was never written">'
        "<script>console.error('render failed'); undefined_function();</script>"
        "</body></html>"
    )
    page = browser.load(bad, tmp_path / "bad.png")
    assert any("render failed" in e for e in page.console_errors), page.console_errors
    assert any("undefined_function" in e for e in page.exceptions), page.exceptions
    assert any("missing.png" in f for f in page.failed_requests), page.failed_requests
    (plot,) = page.plots
    assert plot["natural_w"] == 0


# -- Data Docs, offline ---------------------------------------------------------------------

# The index's validation rows as bootstrap-table drew them, and all of its data.
_INDEX_ROWS = """JSON.stringify((() => {
  const t = document.querySelector('.ge-index-page-validation-results-table');
  const shown = t ? [...t.querySelectorAll('tbody tr[data-href]')]
    .map(r => r.getAttribute('data-href')) : [];
  const table = t && window.jQuery && jQuery(t).data('bootstrap.table');
  const all = table ? jQuery(t).bootstrapTable('getData').map(r => r._table_row_link_path) : [];
  const options = table ? jQuery(t).bootstrapTable('getOptions') : {};
  return {shown, all, page: options.pagination ? options.pageSize : null};
})())"""
# Per table of a page, its body rows; how many tables bootstrap-table drew; vega loaded.
_PAGE_TABLES = """JSON.stringify({
  rows: [...document.querySelectorAll('table')].map(t => t.querySelectorAll('tbody tr').length),
  drawn: document.querySelectorAll('.bootstrap-table').length,
  vega: typeof vegaEmbed,
})"""


@pytest.fixture(scope="module")
def offline_browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    chromium_binary()
    missing = missing_assets()
    if missing:
        message = f"the Data Docs assets are not installed (make docs-assets): {missing[:3]}"
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with chromium(tmp_path_factory.mktemp("chromium-offline"), offline=True) as b:
        yield b


def test_data_docs_read_offline(
    offline_browser: Browser, reports: dict[str, Path], tmp_path: Path
) -> None:
    docs = reports["docs"]
    validations = sorted(p.relative_to(docs).as_posix() for p in docs.glob("validations/**/*.html"))
    assert len(validations) >= 6, validations  # one per ingested table at least
    index = offline_browser.load(docs / "index.html", tmp_path / "index.png", probe=_INDEX_ROWS)
    assert index.problems == [], index.problems
    found = index.probed
    assert sorted(found["all"]) == validations  # every validation is in the index's table
    # ... and drawn as rows, a page of them at a time when the table pages.
    assert len(found["shown"]) == min(len(validations), found["page"] or len(validations))
    assert set(found["shown"]) <= set(validations)
    pages = [docs / v for v in validations] + sorted(docs.glob("expectations/*.html"))
    for page in pages:
        shot = tmp_path / f"{page.stem}.png"
        load = offline_browser.load(page, shot, probe=_PAGE_TABLES)
        assert load.problems == [], (page, load.problems)
        found = load.probed
        assert found["vega"] == "function", (page, found)
        assert found["drawn"] > 0 and sum(found["rows"]) > 0, (page, found)
        with Image.open(shot) as image:
            assert _variance(image) > MIN_PAGE_VARIANCE, page


def test_data_docs_with_cdn_links_show_nothing_offline(
    offline_browser: Browser, reports: dict[str, Path], tmp_path: Path
) -> None:
    """The check above can fail: the same index with its CDN links back lists no rows."""
    index = (reports["docs"] / "index.html").read_text(encoding="utf-8")
    for url, (package, name) in CDN_FILES.items():
        index = index.replace(f"static/vendor/{package}/{name}", url)
    cdn = reports["docs"] / "index-cdn.html"
    cdn.write_text(index, encoding="utf-8")
    try:
        page = offline_browser.load(cdn, tmp_path / "cdn.png", probe=_INDEX_ROWS)
    finally:
        cdn.unlink()
    assert any("code.jquery.com" in f for f in page.failed_requests), page.failed_requests
    assert page.probed == {"shown": [], "all": [], "page": None}
