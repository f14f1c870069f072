"""The pages under docs/ are what the code generates (python -m nvfp4lib docs --write)."""
from nvfp4lib.study import docs
from nvfp4lib.study.cli import build_parser


def test_generated_pages_are_current():
    pages = docs.pages(build_parser())
    stale = [str(p.relative_to(docs.ROOT)) for p, text in pages.items() if not p.exists() or p.read_text() != text]
    assert not stale, f"stale: {stale}; run python -m nvfp4lib docs --write"
