"""examples/calibrator_choice.py against the test server: its tables are the ones
docs/histograms.md shows (each cell within a small tolerance, for another CPU's
training arithmetic), and the page's claims about when each calibrator helps hold."""

from __future__ import annotations

import re
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "examples"))
import calibrator_choice as example  # noqa: E402

PAGE = REPO / "docs/histograms.md"
#: How far a measured cell may be from the page's: 1.5 points of accuracy (5 of the 360
#: test images), 0.02 of the range kept.
TOLERANCE = {"%": 1.5, "": 0.02}


def rows(text: str) -> dict[str, list[str]]:
    """The Markdown table rows of `text` by their first cell (headers included)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            first, *rest = [c.strip() for c in line.strip("|").split(" | ")]
            out[first] = rest
    return out


def test_the_tables_and_the_claims(server, capsys) -> None:
    accuracies, kept = example.measure(server.target)
    measured = example.format_tables(accuracies, kept)
    with capsys.disabled():
        print("\n" + measured)

    page = rows(PAGE.read_text())
    for first, cells in rows(measured).items():
        assert first in page, f"docs/histograms.md has no row {first!r}; the script prints\n" \
                              f"{measured}"
        shown = page[first]
        assert len(shown) == len(cells), first
        for want, got in zip(shown, cells):
            if not re.fullmatch(r"[\d.]+%?", got):
                assert want == got, f"{first}: the page says {want!r}, the script {got!r}"
                continue
            unit = "%" if got.endswith("%") else ""
            assert abs(float(want.rstrip("%")) - float(got.rstrip("%"))) <= TOLERANCE[unit], \
                f"{first}: the page says {want}, the script measures {got}\n{measured}"

    # What the page says of each calibrator.
    clean, pixels, hot, channel = (accuracies[c] for c in example.CASES)
    assert all(clean[m] >= clean["float"] - 0.01 for m in example.METHODS)
    for case in (pixels, hot, channel):  # the full range costs most of the accuracy
        assert case["global_minmax"] < case["float"] - 0.2
    # percentile: clips outliers rarer than 0.01% of the values, not more frequent ones.
    assert hot["percentile"] > hot["float"] - 0.01
    assert kept["three hot pixels"]["percentile"] < 0.1
    assert pixels["percentile"] < pixels["float"] - 0.1
    assert kept["one channel x16"]["percentile"] > 0.9
    # entropy with the defaults keeps the full range when the outliers lie beyond 32x
    # the bulk (empty bins between), and clips them with start_bin=32.
    assert kept["three hot pixels"]["entropy"] >= 1.0 and hot["entropy"] < 0.2
    assert hot["entropy start_bin=32"] > hot["float"] - 0.01
    # mse never keeps the full range where there are outliers, and is the only one that
    # clips the outlier channel.
    assert all(kept[c]["mse"] < 0.9 for c in list(example.CASES)[1:])
    assert channel["mse"] > max(channel[m] for m in example.METHODS if m != "mse") + 0.05
    # moving_average follows the batches: rare outliers move its range little.
    assert pixels["moving_average"] > pixels["float"] - 0.1
