"""The node's web view in a real browser (issue 37): headless Chromium from Debian's packages
(``scripts/setup.sh`` installs them), driven by Selenium, against three real node processes.
The page shows the three converged, the partitioned one diverging, then healing through the
page's own partition switch; Swagger UI loads with no internet; no console errors. The
screenshots are saved under ``bench-results/web-view/``."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from cluster.local import Cluster
from cluster.scenario import Authors

pytestmark = pytest.mark.slow

SCREENSHOTS = Path(__file__).resolve().parents[2] / "bench-results" / "web-view"


def _wait_for(what: str, done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.25)
    raise TimeoutError(f"{what}: not within {timeout_s} s")


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, (
        "chromium and chromedriver not found: ./scripts/setup.sh installs them "
        "(Debian's packages; it needs root or sudo)"
    )
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1280,1400")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


# the page redraws its tables every second: read them in one script, click with a retry
ROWS_JS = """return Array.from(document.querySelectorAll('#network tbody tr'),
    (row) => [row.dataset.peer, row.dataset.agrees, row.innerText]);"""


def _rows(browser: webdriver.Chrome) -> dict[str, str]:
    """peer id -> "true"/"false" (agrees) for the network table's rows."""
    return {peer: agrees for peer, agrees, _ in browser.execute_script(ROWS_JS)}


def _row_text(browser: webdriver.Chrome, peer: str) -> str:
    return next(text for p, _, text in browser.execute_script(ROWS_JS) if p == peer)


def _click(browser: webdriver.Chrome, css: str) -> None:
    for _ in range(20):
        try:
            browser.find_element(By.CSS_SELECTOR, css).click()
            return
        except StaleElementReferenceException:
            time.sleep(0.05)
    raise AssertionError(f"{css}: redrawn under every click")


def _summary(browser: webdriver.Chrome) -> str:
    return browser.find_element(By.ID, "summary").text


def _console_errors(browser: webdriver.Chrome) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_the_page_shows_convergence_a_partition_and_the_heal(
    tmp_path: Path, browser: webdriver.Chrome
) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    authors = Authors(2)
    with Cluster(3, tmp_path, sync_interval_s=1.0) as cluster:
        cluster.start()
        a, b, c = cluster.nodes
        cluster.post_ops(0, [*authors.joins, *authors.messages(20, "before")])
        cluster.wait_converged(timeout_s=30)

        browser.get(f"{a.url}/")
        everyone = {a.peer_id: "true", b.peer_id: "true", c.peer_id: "true"}
        _wait_for("three nodes agreeing on the page", lambda: _rows(browser) == everyone)
        _wait_for("the summary", lambda: _summary(browser).startswith("all 3 nodes agree"))
        # the charts have samples: the legend shows a rate for ops written
        legend = browser.find_element(By.ID, "legend-ops").text
        assert "written" in legend and "–" not in legend, legend
        browser.save_screenshot(str(SCREENSHOTS / "1-converged.png"))

        # the admin token typed into the page opens the partition switch
        token = (a.data / "admin.token").read_text().strip()
        browser.find_element(By.ID, "token").send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "#token-form button[type=submit]").click()
        _wait_for(
            "switches shown",
            lambda: (
                "admin" in (browser.find_element(By.TAG_NAME, "body").get_attribute("class") or "")
            ),
        )

        cluster.partition(2)
        cluster.post_ops(0, authors.messages(20, "during", start=100))
        _wait_for(
            "c diverging",
            lambda: (
                _rows(browser).get(c.peer_id) == "false" and _rows(browser).get(b.peer_id) == "true"
            ),
        )
        assert _summary(browser).startswith("2 of 3 nodes agree"), _summary(browser)
        row = _row_text(browser, c.peer_id)
        assert "cut" in row and "differs" in row, row
        browser.save_screenshot(str(SCREENSHOTS / "2-partitioned.png"))

        # heal a's side with the page's button, the rest through the other nodes' switches
        _click(browser, f'#network tr[data-peer="{c.peer_id}"] button[data-action="unblock"]')
        _wait_for("a unblocked c", lambda: c.peer_id not in cluster.status(0)["blocked_peers"])
        cluster.heal(2)
        _wait_for("c agreeing again", lambda: _rows(browser) == everyone, timeout_s=60)
        _wait_for("the summary", lambda: _summary(browser).startswith("all 3 nodes agree"))
        browser.save_screenshot(str(SCREENSHOTS / "3-healed.png"))
        assert _console_errors(browser) == []

        # Swagger UI from the package's own files: no CDN needed
        browser.get(f"{a.url}/docs")
        _wait_for(
            "Swagger UI",
            lambda: (
                "chatsync node"
                in " ".join(
                    e.text
                    for e in browser.find_elements(By.CSS_SELECTOR, ".swagger-ui .info .title")
                )
            ),
        )
        assert _console_errors(browser) == []
