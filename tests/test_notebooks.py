"""Execute every notebook headlessly (papermill) in recorded mode, as CI and `make study` do."""
import pytest

from nvfp4lib.study.notebooks import execute, notebooks, render_html

NOTEBOOKS = notebooks()


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_and_renders(nb, tmp_path):
    executed = execute(nb, tmp_path, live=False, timeout=1200)
    html = render_html(executed, tmp_path)
    assert html.stat().st_size > 10_000
