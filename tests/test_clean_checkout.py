"""Running the README's commands leaves the checkout as it was: rendered HTML is byte-identical from one run to the
next and names no path of the machine, and `compile` writes to data/ only when asked to (--record)."""
import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from nvfp4lib.bench import store
from nvfp4lib.study.cli import main
from nvfp4lib.study.notebooks import NOTEBOOKS, ROOT, execute, render_html, stable_cell_ids


def test_cell_ids_derive_from_the_name_and_index():
    nb = new_notebook(cells=[new_markdown_cell("# x"), new_code_cell("1 + 1"), new_code_cell("2")])
    ids = [c.id for c in stable_cell_ids(nb, "00_demo").cells]
    other = new_notebook(cells=[new_markdown_cell("# y") for _ in range(3)])
    again = [c.id for c in stable_cell_ids(other, "00_demo").cells]
    assert ids == again == ["00_demo-0", "00_demo-1", "00_demo-2"]
    nbformat.validate(nb)


def test_printed_text_renders_the_same_however_the_kernel_chunked_it(tmp_path):
    pages = []
    for i, chunks in enumerate((["a: 1\nb: 2\n"], ["a: 1\n", "b: 2\n"])):
        cell = new_code_cell("print('a: 1'); print('b: 2')", id=f"random{i}",
                             outputs=[new_output("stream", name="stdout", text=t) for t in chunks])
        path = tmp_path / f"run{i}" / "00_demo.ipynb"
        path.parent.mkdir()
        nbformat.write(new_notebook(cells=[cell]), path)
        pages.append(render_html(path, tmp_path / f"html{i}").read_bytes())
    assert pages[0] == pages[1]


def test_a_notebook_renders_to_the_same_bytes_twice(tmp_path):
    # 08 is cheap (no compiling) and printed a PosixPath of this machine before; papermill gives its injected
    # parameters cell a fresh random id on each run, which the rendered page used to carry
    nb = NOTEBOOKS / "08_scoreboard.ipynb"
    pages = [render_html(execute(nb, tmp_path / f"run{i}", live=False, timeout=300), tmp_path / f"html{i}")
             for i in range(2)]
    first, second = (p.read_bytes() for p in pages)
    assert first == second
    text = first.decode()
    for machine_path in {str(ROOT), str(tmp_path), str(ROOT.parent)}:
        assert machine_path not in text
    assert "PosixPath(" not in text


def test_compile_writes_to_build_unless_recording(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(store, "SCRATCH_DIR", tmp_path / "build")
    before = store.COMPILE.read_bytes()
    assert main(["compile", "--arch", "sm_90a", "--config", "tile128x256_1wg"]) == 0
    assert store.COMPILE.read_bytes() == before
    assert store.read_rows(tmp_path / "build" / "compile.jsonl")[0]["config"] == "tile128x256_1wg"
    assert "add --record" in capsys.readouterr().out
    recorded = tmp_path / "recorded.jsonl"
    assert main(["compile", "--arch", "sm_90a", "--config", "tile128x256_1wg", "--record", str(recorded)]) == 0
    assert len(store.read_rows(recorded)) == 1
    assert len(store.read_rows(tmp_path / "build" / "compile.jsonl")) == 1  # --record replaces build/, not adds


def test_record_flag_alone_means_data(tmp_path):
    import argparse

    from nvfp4lib.study import cli as cli

    p = argparse.ArgumentParser()
    cli._add_record_args(p, store.BENCH, "bench")
    assert p.parse_args([]).record is None
    assert p.parse_args(["--record"]).record == store.BENCH
    assert p.parse_args(["--record", str(tmp_path / "x.jsonl")]).record == tmp_path / "x.jsonl"
