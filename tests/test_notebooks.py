"""Execute every notebook headlessly (papermill) in recorded mode, as CI and `make study` do."""
import pytest

from nvfp4lib.study.notebooks import execute, images, notebooks, output_problems, render_html, typed_numbers

NOTEBOOKS = notebooks()


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_and_renders(nb, tmp_path):
    executed = execute(nb, tmp_path, live=False, timeout=1200)
    html = render_html(executed, tmp_path)
    assert html.stat().st_size > 10_000
    # every number with a unit in the Markdown is one a cell computes (none typed by hand, none stale)
    assert not typed_numbers(executed), f"{nb.name}: numbers typed in Markdown that no output shows"
    assert not output_problems(executed), f"{nb.name}: outputs a reader should not meet"
    if "save(" in nb.read_text():  # the figures it writes are shown in the page too
        assert images(executed) >= 1, f"{nb.name}: writes figures but shows none"
