"""Run the whole study: every notebook in notebooks/, in order, executed by papermill and rendered to HTML.

Without a GPU the notebooks run in "recorded" mode (they plot measurements from data/); with a
CUDA GPU they measure live. Executed copies go to build/study/, HTML to figures/html/.
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
BUILD = ROOT / "build" / "study"
HTML = ROOT / "figures" / "html"


def notebooks(only: list[str] | None = None) -> list[Path]:
    nbs = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if only:
        nbs = [p for p in nbs if any(p.name.startswith(o) or o in p.stem for o in only)]
        if not nbs:
            raise ValueError(f"no notebook matches {only}; have: {[p.name for p in notebooks()]}")
    return nbs


def gpu_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def execute(nb: Path, out_dir: Path, *, live: bool, timeout: int = 3600, extra: dict | None = None) -> Path:
    import papermill as pm

    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / nb.name
    pm.execute_notebook(str(nb), str(out), parameters={"live": live, **(extra or {})}, cwd=str(nb.parent),
                        kernel_name="python3", progress_bar=False, execution_timeout=timeout,
                        log_output=False)
    return out


def stable_cell_ids(nb, name: str):
    """Give every cell of ``nb`` an id derived from ``name`` and its index, in place; returns ``nb``.

    The rendered page carries each cell's id. papermill gives the cell it injects a random one on every run (and
    nbformat invents one for a cell saved without), so the HTML changed on each render of unchanged data."""
    slug = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name)[:50]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{slug}-{i}"
    return nb


def render_html(executed: Path, html_dir: Path) -> Path:
    """Render an executed notebook to ``html_dir``/<name>.html, byte-identical for identical outputs."""
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    html_dir.mkdir(parents=True, exist_ok=True)
    nb = stable_cell_ids(nbformat.read(str(executed), as_version=4), executed.stem)
    exporter = HTMLExporter()
    # the kernel flushes a cell's printed text in chunks whose boundaries depend on timing; unmerged, each chunk
    # becomes its own block and the page changes from run to run
    exporter.register_preprocessor(CoalesceStreamsPreprocessor(enabled=True), enabled=True)
    body, _ = exporter.from_notebook_node(nb)
    out = html_dir / (executed.stem + ".html")
    out.write_text(_shared_style(body, html_dir), encoding="utf-8")
    return out


STYLE = "notebook.css"
_STYLE_BLOCKS = re.compile(r"<style[^>]*>.*?</style>\s*", re.S)


def _shared_style(body: str, html_dir: Path) -> str:
    """The page with the style sheets of its head moved to one file every page links (``STYLE`` in ``html_dir``):
    the template puts the same ~260 KB of CSS in each page. A page whose CSS differs from the shared file keeps its
    own inline. (Style blocks inside cell outputs, e.g. a styled table's, stay where they are.)"""
    end = body.find("</head>")
    head = body[:end] if end >= 0 else ""
    blocks = _STYLE_BLOCKS.findall(head)
    if not blocks:
        return body
    css = "".join(re.sub(r"^<style[^>]*>|</style>\s*$", "", b) + "\n" for b in blocks)
    sheet = html_dir / STYLE
    if sheet.exists() and sheet.read_text(encoding="utf-8") != css:
        return body
    sheet.write_text(css, encoding="utf-8")
    first = head.index(blocks[0])
    rest = _STYLE_BLOCKS.sub("", head[first:])
    return body[:first] + f'<link rel="stylesheet" href="{STYLE}">\n' + rest + body[end:]


def run_study(*, live: bool | None = None, only=None, html: bool = True, out_dir: Path = BUILD,
              html_dir: Path = HTML) -> int:
    from tqdm import tqdm

    live = gpu_available() if live is None else live
    nbs = notebooks(only)
    mode = "live (measuring on the GPU)" if live else "recorded (plots from data/, no GPU needed)"
    print(f"nvfp4lib study: {len(nbs)} notebooks, mode: {mode}")
    results = []
    bar = tqdm(nbs, unit="notebook", file=sys.stdout)
    for nb in bar:
        bar.set_description(nb.stem)
        t0 = time.perf_counter()
        try:
            executed = execute(nb, out_dir, live=live)
            page = render_html(executed, html_dir) if html else None
            results.append((nb.name, "ok", time.perf_counter() - t0, page))
        except Exception as e:  # keep going: one broken notebook should not hide the others
            results.append((nb.name, f"FAILED: {type(e).__name__}: {str(e).splitlines()[-1][:200] if str(e) else ''}",
                            time.perf_counter() - t0, None))
    bar.close()
    print("\nSummary")
    width = max(len(r[0]) for r in results)
    for name, status, secs, page in results:
        where = page.relative_to(ROOT) if page else "-"
        print(f"  {name:<{width}}  {status:<8}  {secs:6.1f} s  {where}")
    failed = [r for r in results if r[1] != "ok"]
    print(f"\n{len(results) - len(failed)} of {len(results)} notebooks ran; executed copies in "
          f"{out_dir.relative_to(ROOT) if out_dir.is_relative_to(ROOT) else out_dir}, HTML in "
          f"{html_dir.relative_to(ROOT) if html_dir.is_relative_to(ROOT) else html_dir}")
    return 1 if failed else 0


# A number with a unit in Markdown: times, rates, bandwidths, sizes, ratios and percentages. A dimension such as
# 128×128 is not one (× followed by a digit), nor a name such as S1 or sm_90.
_NUMBER_WITH_UNIT = re.compile(
    r"(?<![\w.\-/])(\d+(?:,\d{3})*(?:\.\d+)?)\s?(µs|us|ms|ns|TB/s|GB/s|TFLOP/s|TFLOPS|PFLOP/s|MB|GB|KB|KiB|MiB|GiB"
    r"|%|×(?!\s?\d)|x(?=\s)(?!\s?\d))")


def typed_numbers(executed: Path) -> list[str]:
    """The numbers with units in ``executed``'s Markdown cells that no code cell's output shows (as text, a table or
    a figure's caption): numbers typed by hand, which go stale when the data change. Each as ``"cell i: 12.3 us"``."""
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    shown = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if "text" in out:
                shown.append(out["text"] if isinstance(out["text"], str) else "".join(out["text"]))
            for key in ("text/plain", "text/html", "text/markdown"):
                v = out.get("data", {}).get(key)
                if v:
                    shown.append(v if isinstance(v, str) else "".join(v))
    computed = "\n".join(shown)
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        text = re.sub(r"`[^`]*`", "", cell.source)  # code spans name things (configs, commands), they state no result
        for m in _NUMBER_WITH_UNIT.finditer(text):
            if m.group(1) not in computed:
                bad.append(f"cell {i}: {m.group(0)}")
    return bad


_TRUNCATED = re.compile(r"\d+ rows [×x] \d+ columns")
_NAN = re.compile(r"(?<![\w.])(nan|NaN)(?![\w(])")


def output_problems(executed: Path) -> list[str]:
    """What a reader should never meet in ``executed``'s outputs: a table pandas truncated (the verdict must rest on
    what is shown), a NaN where a number belongs, an error. Each as ``"cell i: ..."``."""
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                bad.append(f"cell {i}: error {out.get('ename')}")
            texts = [out.get("text", "")] + [out.get("data", {}).get(k, "") for k in ("text/plain", "text/html")]
            text = "\n".join(t if isinstance(t, str) else "".join(t) for t in texts)
            if _TRUNCATED.search(text):
                bad.append(f"cell {i}: a truncated table ({_TRUNCATED.search(text).group(0)})")
            if _NAN.search(re.sub(r"<[^>]+>", " ", text)):
                bad.append(f"cell {i}: NaN in an output")
    return bad


def images(executed: Path) -> int:
    """How many figures ``executed``'s outputs show."""
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    return sum("image/png" in out.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for out in c.get("outputs", []))
