"""The reports as a person sees them: rendered by a real headless Chromium.

A small real lake (test_audit_pipeline's store and ledgers, ingested and audited) gets its
audit report and DLQ report from `mqaudit pipeline report` / `dlq-report`; each page must
load with no console error, exception or failed load, every plot must decode to a non-empty
image, and the screenshot must show the plots (their areas are not blank).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image, ImageStat
from pyspark.sql import SparkSession

from broker_runtime.cli.main import main
from pipeline.jobs.audit import run_audit
from pipeline.jobs.ingest import run_ingest
from pipeline.spark_session import build_spark
from tests.browser import Browser, PageLoad, chromium, chromium_binary
from tests.integration.audit_data import build_data_dir

pytestmark = [pytest.mark.slow, pytest.mark.integration]

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
    spark: SparkSession = build_spark("mqaudit-tests", "local[2]")
    root = tmp_path_factory.mktemp("reports")
    lake = root / "lake"
    run_ingest(build_data_dir(root), lake, spark, progress=False)
    run_audit(lake, spark, progress=False)
    assert main(["pipeline", "report", "--lake", str(lake), "--out", str(root / "audit")]) == 0
    assert main(["pipeline", "dlq-report", "--lake", str(lake), "--out", str(root / "dlq")]) == 0
    return {"audit": root / "audit" / "audit_report.html", "dlq": root / "dlq" / "dlq_report.html"}


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
    _assert_shows_its_plots(page, plots=4)
    names = sorted(Path(p["src"]).name for p in page.plots)
    assert names == [
        "dead_letters_by_group_age.png",
        "duplicates_by_cause.png",
        "lag_over_time.png",
        "losses_by_cause.png",
    ]


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
