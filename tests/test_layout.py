"""The package's shape: kernels depend on nothing above them, and no two modules (a package's ``__init__`` included:
importing ``a.b.c`` runs ``a.b``'s first) import each other at load time."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "nvfp4lib"
ABOVE_KERNELS = {"bench", "store", "api", "tuning", "serving", "calls", "study", "compile_reports", "nn",
                 "serving_report", "plots"}


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


def test_no_import_cycle_at_load_time():
    modules = {_module(f): f for f in _files()}
    graph = {}
    for m, f in modules.items():
        targets = {t for t in _imports(f, top_level_only=True) if t in modules and t != m}
        graph[m] = targets | {p for t in targets for p in _packages_entered(m, t, modules)}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for t in graph[m]:
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])


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
