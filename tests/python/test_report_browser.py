"""qparams-cli report --html, rendered by headless Chromium (Debian's /usr/bin/chromium):
the page shows one plot per initialized session, the uninitialized sessions above
them, a histogram session's histogram laid out with its two markers, and makes no
console message; a screenshot is kept as a test artifact.

Chromium logs every console message of the page on stderr as a ":CONSOLE" line (an
uncaught error, a resource or script its Content-Security-Policy refuses). The second
test proves that check on a copy of the page with a deliberate script error.

The screenshot lands in pytest's temporary directory (its path printed, see -s) and,
when $QPARAMS_ARTIFACTS_DIR is set (ctest sets <build>/test-artifacts), is copied
there as report.png.
"""

from __future__ import annotations

import html as html_module
import json
import os
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

import qparams
from conftest import REPO

CHROMIUM = "/usr/bin/chromium"
TIMEOUT = 120  # seconds, for each process; Chromium takes about 3 here
PREFIX = "report-browser/"


def cli_binary() -> str:
    path = os.environ.get("QPARAMS_CLI") or str(REPO / "build/tools/qparams-cli")
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not an executable; build first or set $QPARAMS_CLI")
    return path


def chromium(tmp: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium with `args`, in a profile of its own. --no-sandbox: CI runs as
    root, where Chromium refuses its sandbox."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing (Debian package chromium)")
    profile = tmp / "chromium-profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", f"--user-data-dir={profile}", "--hide-scrollbars", *args],
        capture_output=True, text=True, timeout=TIMEOUT, check=False)


# Console messages of any level ("[...:INFO:CONSOLE:12] "Uncaught Error: x", source:
# file:///... (12)"; older builds write CONSOLE(12)). The page has no script, so it
# makes none. Chromium's own noise (dbus, GPU, sandbox) never carries the page's URL.
_CONSOLE = re.compile(r":CONSOLE[:(]")


def page_problems(stderr: str, url: str) -> list[str]:
    """The lines of Chromium's log about the page: its console messages, and errors
    that name it."""
    return [line for line in stderr.splitlines()
            if _CONSOLE.search(line) or (":ERROR:" in line and url in line)]


def dump_dom(tmp: pathlib.Path, page: pathlib.Path) -> tuple[str, list[str]]:
    """The page's DOM once loaded, and page_problems of the load."""
    url = page.as_uri()
    result = chromium(tmp, "--dump-dom", url)
    assert result.returncode == 0, result.stderr
    return result.stdout, page_problems(result.stderr, url)


@pytest.fixture(scope="module")
def report(server, tmp_path_factory) -> tuple[pathlib.Path, str]:
    """Six sessions (per channel, per block, per tensor, 2000 channels, an entropy one
    with an outlier, and one never observed) and the report of them: the page's path
    and the table on stdout."""
    rng = np.random.default_rng(15)
    with qparams.Client(server.target) as client:
        client.create_session(PREFIX + "conv1.weight", calculator="global_minmax", dtype="int8",
                              qscheme="symmetric", granularity="per_channel:0", target="weight")
        client.observe(PREFIX + "conv1.weight", (rng.standard_normal((32, 27))
                       * np.linspace(0.1, 3, 32)[:, None]).astype(np.float32))
        client.create_session(PREFIX + "fc.weight", calculator="static", dtype="int4",
                              qscheme="asymmetric", granularity="per_block:1:32", target="weight")
        client.observe(PREFIX + "fc.weight", rng.standard_normal((16, 128)).astype(np.float32))
        client.create_session(PREFIX + "fc.input", calculator="moving_average", dtype="uint8",
                              qscheme="asymmetric", target="activation")
        for i in range(3):
            client.observe(PREFIX + "fc.input",
                           rng.standard_normal((8, 128)).astype(np.float32) * (i + 1))
        client.create_session(PREFIX + "wide.weight", calculator="global_minmax",
                              granularity="per_channel:0", target="weight")
        client.observe(PREFIX + "wide.weight", rng.standard_normal((2000, 8)).astype(np.float32))
        client.create_session(PREFIX + "fc.output", calculator="entropy", target="activation")
        output = rng.standard_normal(4096).astype(np.float32)
        output[100] = -12.5  # max |x|, far beyond what entropy keeps
        client.observe(PREFIX + "fc.output", output)
        client.create_session(PREFIX + "head.weight", calculator="global_minmax",
                              granularity="per_channel:0", target="weight")

    page = tmp_path_factory.mktemp("report") / "report.html"
    result = subprocess.run(
        [cli_binary(), f"--target={server.target}", "report", f"--prefix={PREFIX}",
         "--format=table", f"--html={page}"],
        capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return page, result.stdout


def test_page_renders_a_plot_per_initialized_session(report, tmp_path) -> None:
    page, table = report
    rows = [line.split()[0] for line in table.splitlines()[1:7]]
    assert rows == [PREFIX + "head.weight", PREFIX + "conv1.weight", PREFIX + "fc.input",
                    PREFIX + "fc.output", PREFIX + "fc.weight", PREFIX + "wide.weight"]

    dom, problems = dump_dom(tmp_path, page)
    assert problems == []
    assert dom.count('<svg class="plot"') == 5
    assert dom.index('id="uninitialized"') < dom.index('<svg class="plot"')
    assert dom.index(PREFIX + "head.weight") < dom.index('<svg class="plot"')
    assert "Initialized sessions (5)" in dom
    assert "up to 4 adjacent" in dom  # 2000 channels over 512 points
    assert dom.count('<path class="hist"') == 1  # fc.output's histogram
    assert re.search(r">amax \(entropy\) = [0-9.]+</text>", dom)
    assert ">max |x| = 12.5</text>" in dom

    screenshot = tmp_path / "report.png"
    result = chromium(tmp_path, f"--screenshot={screenshot}", "--window-size=1280,2000",
                      page.as_uri())
    assert result.returncode == 0, result.stderr
    assert page_problems(result.stderr, page.as_uri()) == []
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"screenshot: {screenshot}")
    if artifacts := os.environ.get("QPARAMS_ARTIFACTS_DIR"):
        os.makedirs(artifacts, exist_ok=True)
        kept = shutil.copy(screenshot, pathlib.Path(artifacts) / "report.png")
        print(f"screenshot kept: {kept}")


@pytest.mark.parametrize("where, expected", [
    # Before the policy's <meta>, the script runs and throws.
    ("<head>", "Uncaught Error: deliberate"),
    # After it, the policy refuses to run it, which is a console message too.
    ("</body>", "Content Security Policy"),
])
def test_a_script_error_is_detected(report, tmp_path, where, expected) -> None:
    page, _ = report
    html = page.read_text()
    assert html.count(where) == 1
    broken = tmp_path / "broken.html"
    script = '<script>throw new Error("deliberate")</script>'
    broken.write_text(html.replace(where, where + script if where == "<head>" else script + where))
    dom, problems = dump_dom(tmp_path, broken)
    assert dom.count('<svg class="plot"') == 5  # the page still renders
    assert any(expected in line for line in problems), problems


# Measures the histogram plot as laid out, where the page's Content-Security-Policy
# (removed from this copy) would refuse any script.
_MEASURE = """<script>
const svg = document.querySelector("path.hist").ownerSVGElement.getBoundingClientRect();
const hist = document.querySelector("path.hist").getBoundingClientRect();
const box = (r) => [r.left - svg.left, r.top - svg.top, r.width, r.height];
const out = document.createElement("pre");
out.id = "measured";
out.textContent = JSON.stringify({
  svg: [svg.width, svg.height], hist: box(hist),
  markers: ["amax", "max-abs"].map((c) => box(document.querySelector("line." + c)
                                              .getBoundingClientRect())),
  labels: ["amax", "max-abs"].map((c) => box(document.querySelector("text." + c)
                                             .getBoundingClientRect()))});
document.body.append(out);
</script>"""


def test_the_histogram_renders_with_its_markers(report, tmp_path) -> None:
    page, _ = report
    html = page.read_text()
    policy = re.search(r'<meta http-equiv="Content-Security-Policy"[^>]*>\n', html)
    assert policy is not None
    measured = tmp_path / "measured.html"
    measured.write_text(html.replace(policy.group(0), "").replace("</body>", _MEASURE + "</body>"))
    dom, problems = dump_dom(tmp_path, measured)
    assert problems == []
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom)
    assert found is not None, dom[-2000:]
    m = json.loads(html_module.unescape(found.group(1)))
    width, height = m["svg"]
    assert width > 300 and height > 100, m
    # The outline spans most of the plot's width (0 to the last occupied bin) and rises
    # well above its baseline.
    assert m["hist"][2] > 0.7 * width and m["hist"][3] > 0.3 * height, m
    for left, top, w, h in m["markers"]:  # vertical lines inside the plot, full height
        assert 0 < left < width and w < 3 and h > 0.3 * height, m
    amax, max_abs = m["markers"]
    assert amax[0] < max_abs[0], m  # entropy clipped the outlier
    for left, top, w, h in m["labels"]:  # drawn, inside the plot
        assert w > 40 and h > 5 and 0 <= left and left + w <= width and 0 <= top < height, m
    assert m["labels"][0][1] != m["labels"][1][1], "the labels sit on rows of their own"
