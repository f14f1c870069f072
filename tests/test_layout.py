"""The package's shape: three layers, arrows one way (study -> bench -> core), kernels below everything else in the
core, and no import cycle, counting imports inside functions too (a package's ``__init__`` included: importing
``a.b.c`` runs ``a.b``'s first)."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "nvfp4lib"
ABOVE_KERNELS = {"bench", "study", "api", "tuning", "serving", "compat", "nn", "hf"}
# the entry point of `python -m nvfp4lib`: it only hands over to the study's command line, and nothing imports it
ENTRY = "nvfp4lib.__main__"


def _module(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, top_level_only: bool):
    """Absolute names of the nvfp4lib modules ``path`` imports (at load time only, if asked)."""
    tree = ast.parse(path.read_text())
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("nvfp4lib"):
                yield target
                for alias in node.names:
                    yield f"{target}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("nvfp4lib"):
                    yield alias.name


def _files():
    return sorted(PKG.rglob("*.py"))


def test_kernels_import_nothing_above_them():
    bad = []
    for f in (PKG / "kernels").rglob("*.py"):
        for target in _imports(f, top_level_only=False):
            parts = target.split(".")
            if len(parts) > 1 and parts[1] in ABOVE_KERNELS:
                bad.append(f"{f.relative_to(PKG)} imports {target}")
    assert not bad, "\n".join(sorted(set(bad)))


def _packages_entered(m: str, target: str, modules) -> set[str]:
    """The packages whose ``__init__`` importing ``target`` runs first, seen from ``m`` (a package ``m`` is already
    inside is loaded before ``m`` is, so it adds no edge)."""
    parts = target.split(".")
    return {p for i in range(1, len(parts)) if (p := ".".join(parts[:i])) in modules
            and m != p and not m.startswith(p + ".")}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ("bench", "study") else "core"


def _graph(top_level_only: bool) -> dict[str, set[str]]:
    modules = {_module(f): f for f in _files()}
    graph = {}
    for m, f in modules.items():
        # (a package that m is inside is loaded before m: importing from it adds no edge)
        targets = {t for t in _imports(f, top_level_only) if t in modules and t != m and not m.startswith(t + ".")}
        graph[m] = targets | {p for t in targets for p in _packages_entered(m, t, modules)}
    return graph


def test_layers_point_one_way():
    """The core imports neither bench nor study; bench never imports study (imports inside functions count)."""
    allowed = {"core": {"core"}, "bench": {"core", "bench"}, "study": {"core", "bench", "study"}}
    bad = [f"{m} ({_layer(m)}) imports {t} ({_layer(t)})" for m, targets in _graph(False).items() if m != ENTRY
           for t in targets if _layer(t) not in allowed[_layer(m)]]
    assert not bad, "\n".join(sorted(bad))


def _find_cycle(graph):
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_no_import_cycle():
    """No cycle, whether an import runs at load time or inside a function."""
    _find_cycle(_graph(False))


def test_no_import_cycle_at_load_time():
    _find_cycle(_graph(True))


def test_no_package_file_over_800_lines():
    long = {str(f.relative_to(PKG)): n for f in _files() if (n := len(f.read_text().splitlines())) > 800}
    assert not long, f"split these by stage or concern: {long}"


def test_ptx_digest_ignores_source_locations_only():
    """Compile reports carry ``ptx_sha256``: equal for the same device code from another file or line, different for
    any other change."""
    from nvfp4lib.kernels.common.compiling import ptx_digest

    ptx = ".version 8.3\n.file 1 \"/a/kernel.py\"\n\t.loc 1 10 3\n\tadd.s32 %r1, %r2, %r3;\n// note\n"
    moved = ".version 8.3\n.file 1 \"/b/mainloop.py\"\n\t.loc 1 99 7\n\tadd.s32 %r1, %r2, %r3;\n"
    assert ptx_digest(ptx) == ptx_digest(moved)
    assert ptx_digest(ptx) != ptx_digest(moved.replace("add.s32", "sub.s32"))
