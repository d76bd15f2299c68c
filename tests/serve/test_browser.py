"""The web page in a real browser: headless Chromium (Debian's package, driven by Playwright) on a
real `nmt serve`. Types sentences, reads the translations and the heatmap, opens the run view.
Screenshots go to test-artifacts/ (gitignored)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="nmt serve needs the serve extra (fastapi, uvicorn)")
sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs `pip install playwright`")

from serving import ROOT, request, start_server, stop  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
CHROMIUM = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if Path(p).exists()), None)
ARTIFACTS = ROOT / "test-artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_run):
    proc, port = start_server(tiny_run)
    yield port
    stop(proc)


@pytest.fixture(scope="module")
def page():
    if CHROMIUM is None:
        pytest.skip("no system Chromium (apt-get install chromium chromium-driver; .ci/run does this)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        tab = browser.new_page(viewport={"width": 1100, "height": 900})
        yield tab
        browser.close()


def _canvas_ink(page) -> dict:
    """Rows/cols the page drew, and how many pixels of the heatmap are not white."""
    return page.evaluate(
        """() => {
          const c = document.getElementById('heatmap');
          const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          let ink = 0;
          for (let i = 0; i < px.length; i += 4) if (px[i] < 200 && px[i + 2] > 200) ink++;
          return {rows: Number(c.dataset.rows), cols: Number(c.dataset.cols), ink, width: c.width};
        }"""
    )


def test_translate_read_heatmap_and_run_view_in_a_real_browser(server, page):
    lines = ["他们买了七只红色的猫。", "这本书二十五元。"]
    page.goto(f"http://127.0.0.1:{server}/")
    sync_api.expect(page.locator("#model")).to_contain_text("final.safetensors")
    page.fill("#source", "\n".join(lines))
    page.click("#go")
    page.wait_for_selector("#results li:nth-child(2)")
    shown = page.locator(".hyp.best .text").all_inner_texts()
    beam = int(page.input_value("#beam"))
    expected = request(server, "POST", "/translate", {"text": lines, "beam": beam})[1]["translations"]
    assert shown == [t["text"] for t in expected] and all(shown)
    assert "sentence(s) in" in page.inner_text("#timing")
    assert len(page.locator("#results li:first-child .hyp .score").all_inner_texts()) == min(3, beam)

    page.wait_for_selector("#attention-box:not([hidden])")
    page.wait_for_function("document.getElementById('heatmap').dataset.rows !== undefined")
    amap = request(server, "POST", "/attention", {"text": lines[0], "translation": shown[0]})[1]
    drawn = _canvas_ink(page)
    assert (drawn["rows"], drawn["cols"]) == (len(amap["target"]), len(amap["source"]))
    assert drawn["ink"] > 50  # blue cells were painted
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser-translate.png"), full_page=True)

    page.locator("#results li:nth-child(2) .hyp").first.click()
    sync_api.expect(page.locator("#attention-title")).to_contain_text(lines[1])

    page.click("#tab-run")
    page.wait_for_selector("#curves .chart svg polyline")
    titles = page.locator("#curves .chart h3").all_inner_texts()
    assert any("training loss" in t for t in titles) and any("validation BLEU" in t for t in titles)
    assert "test" in page.inner_text("#evals tbody")
    page.screenshot(path=str(ARTIFACTS / "browser-run.png"), full_page=True)
    assert (ARTIFACTS / "browser-run.png").stat().st_size > 10_000


def test_bad_input_shows_the_servers_error(server, page):
    page.goto(f"http://127.0.0.1:{server}/")
    page.fill("#source", "我" * 2100)  # over the server's --max-chars (2000)
    page.click("#go")
    sync_api.expect(page.locator("#error")).to_contain_text("the limit is 2000")


def test_the_page_follows_the_runs_direction(server, page):
    """An en→zh run (its /info, rewritten here): header, title, prompt, input language and the
    empty-input message follow `languages`."""

    def as_en_zh(route):
        response = route.fetch()
        info = response.json()
        info["languages"] = {"source": "en", "target": "zh"}
        route.fulfill(response=response, json=info)

    page.route("**/info", as_en_zh)
    try:
        page.goto(f"http://127.0.0.1:{server}/")
        page.wait_for_function("document.getElementById('direction').textContent === 'English → 中文'")
        assert page.title() == "nmt · English → 中文"
        assert page.get_attribute("#source", "lang") == "en"
        assert page.get_attribute("#source", "placeholder").startswith("English text")
        page.fill("#source", "")
        page.click("#go")
        assert page.text_content("#error") == "Type an English sentence first."
    finally:
        page.unroute("**/info")
