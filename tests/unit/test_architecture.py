"""The package's architecture, checked: every module of python/gpuprof has a layer,
imports only from its own layer or below, and no import cycle exists. Every import
counts, at module level or inside a function (a deferred import still ties the two
modules together). docs/architecture.md explains the layers.

A module's layer is the folder it is in; an import that this test refuses means the
imported thing belongs lower (move it down) or the importer belongs higher.
"""

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "python" / "gpuprof"

# Lowest first. A module may import from its own layer and the layers before it.
# A module's layer is its folder: python/gpuprof/<layer>/... (docs/architecture.md).
LAYER_ORDER = ["core", "record", "results", "analysis", "exporters", "api", "cli"]
# folders of the top layer besides cli/: the framework adapters and the bundled demo
# workloads, whose public paths (gpuprof.integrations.lightning) are the API
ALSO_CLI = {"integrations", "workloads"}
# the top level: the extension and the version are core; gpuprof/__init__.py and the
# facades (public module paths, each the module of a layer folder) are the API
TOP = {"_gpuprof": "core", "_version": "core", "__main__": "cli", "boot": "cli", "demo": "cli"}
# gpuprof.exporters's __init__ names the exporters for users, as gpuprof's does
FACADE_PACKAGES = {"gpuprof.exporters": "api"}


def layer_of(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 1:
        return "api"  # gpuprof/__init__.py
    if name in FACADE_PACKAGES:
        return FACADE_PACKAGES[name]
    if len(parts) == 2 and not (ROOT / parts[1]).is_dir():
        return TOP.get(parts[1], "api")
    folder = parts[1]
    return "cli" if folder in ALSO_CLI else folder


# Upward imports not yet removed (issue #22). The list is exact: an entry that no
# longer exists fails the test, so that it can only shrink.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The gpuprof modules ``name`` imports, anywhere in its source. ``from X import y``
    counts as importing X.y when that is a module, else X."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        out |= {t for t in targets if t == "gpuprof" or t.startswith("gpuprof.")}
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods) | {"gpuprof._gpuprof"}
    return {name: imports(name, path, known) for name, path in mods.items()}


def test_every_module_has_a_layer():
    wrong = sorted(n for n in modules() if layer_of(n) not in LAYER_ORDER)
    assert not wrong, f"modules outside the layer folders ({', '.join(LAYER_ORDER)}): {wrong}"


def test_the_top_level_holds_only_facades():
    """Each module at the top (but __init__, __main__, _version) is a public path: the
    module of a layer folder, under the name users import."""
    for name, path in modules().items():
        parts = name.split(".")
        if len(parts) != 2 or parts[1] in TOP or (ROOT / parts[1]).is_dir():
            continue
        src = path.read_text()
        assert "sys.modules[__name__] = _impl" in src, f"{name} is not a facade"
        impl = importlib.import_module(name)
        assert impl.__name__ != name and layer_of(impl.__name__) in LAYER_ORDER, name


def test_every_import_names_a_module():
    g = graph()
    known = set(modules()) | {"gpuprof._gpuprof"}
    unknown = {(a, b) for a, deps in g.items() for b in deps if b not in known}
    assert not unknown, f"imports of modules that do not exist: {sorted(unknown)}"


def test_imports_go_down_the_layers():
    g = graph()
    rank = {
        name: LAYER_ORDER.index(layer_of(name)) for name in set(modules()) | {"gpuprof._gpuprof"}
    }
    upward = {(a, b) for a, deps in g.items() for b in deps if b in rank and rank[b] > rank[a]}
    new = sorted(upward - set(KNOWN_UPWARD))
    assert not new, (
        "upward imports ("
        + ", ".join(f"{a} [{layer_of(a)}] -> {b} [{layer_of(b)}]" for a, b in new)
        + ")"
    )
    fixed = sorted(set(KNOWN_UPWARD) - upward)
    assert not fixed, f"remove from KNOWN_UPWARD, these imports are gone: {fixed}"


def test_no_import_cycles():
    """(KNOWN_UPWARD edges are left out: each is already a failure to fix.)"""
    g = {a: deps - {b for x, b in KNOWN_UPWARD if x == a} for a, deps in graph().items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(n, stack):
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                cycles.append(stack[stack.index(m) :] + [m])
            elif m not in state:
                visit(m, stack)
        stack.pop()
        state[n] = 2

    for n in sorted(g):
        if n not in state:
            visit(n, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    "src, want",
    [
        ("from . import tables\n", {"gpuprof.tables"}),
        ("from .tables import format_time\n", {"gpuprof.tables"}),
        ("def f():\n    from .exporters.chrome import x\n", {"gpuprof.exporters.chrome"}),
        ("import gpuprof\n", {"gpuprof"}),
        ("from . import _gpuprof\n", {"gpuprof._gpuprof"}),
    ],
)
def test_the_import_reader_sees_every_form(tmp_path, src, want):
    p = tmp_path / "m.py"
    p.write_text(src)
    known = {"gpuprof.tables", "gpuprof.exporters.chrome", "gpuprof._gpuprof"}
    assert imports("gpuprof.m", p, known) == want


def test_c_enum_values_come_from_the_extension():
    """gpuprof.core._constants reads them from the extension; the extension's own test
    table (built from the same enums) agrees."""
    from gpuprof import _gpuprof
    from gpuprof.core import _constants

    table = _gpuprof._test_constants()
    for name in (
        "OP_PYTHON",
        "OP_CFUNC",
        "OP_USER",
        "OP_STEP",
        "OP_CUDA_API",
        "OPF_HIDDEN",
        "GPU_KERNEL",
        "GPU_MEMCPY",
        "GPU_MEMSET",
        "GPU_SYNC",
        "GPU_MALLOC",
        "GPU_FREE",
        "GPU_API",
    ):
        assert getattr(_constants, name) == getattr(_gpuprof, name) == table[name], name
    assert _constants.OP_KINDS[_gpuprof.OP_CUDA_API] == "cuda_api"


ENUM_PREFIXES = ("OP_", "OPF_", "GPU_", "GF_", "SF_", "CAT_", "API_", "ACT_", "CAPTURE_")
NOT_ENUMS = {
    "gpuprof.analysis.distributed._traces._GPU_TID_BASE"
}  # a lane numbering of merged traces


def test_no_module_copies_a_c_enum_value():
    """A module-level name spelled like a C enum constant and bound to a number
    literal is a copy: import it from gpuprof.core._constants instead."""
    copies = []
    for name, path in modules().items():
        if name == "gpuprof.core._constants":
            continue
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.Assign):
                continue
            targets = [
                t for n in node.targets for t in (n.elts if isinstance(n, ast.Tuple) else [n])
            ]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            if any(isinstance(v, ast.Constant) and type(v.value) is int for v in values):
                copies += [
                    f"{name}.{t.id}"
                    for t in targets
                    if isinstance(t, ast.Name) and t.id.lstrip("_").startswith(ENUM_PREFIXES)
                ]
    copies = [c for c in copies if c not in NOT_ENUMS]
    assert not copies, f"C enum values copied into Python: {copies}"


def test_the_type_stub_names_what_the_extension_defines():
    from gpuprof import _gpuprof

    stub = ast.parse((ROOT / "_gpuprof.pyi").read_text())
    names = set()
    for node in stub.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
    defined = {n for n in dir(_gpuprof) if not n.startswith("__")}
    monitoring = {n for n in names if n.startswith("_mon_")}  # 3.12+ only
    assert defined - names == set(), "add to _gpuprof.pyi"
    assert names - monitoring - defined == set(), "not in the extension: remove from _gpuprof.pyi"
    methods = {
        n.name
        for c in stub.body
        if isinstance(c, ast.ClassDef) and c.name == "Profiler"
        for n in c.body
        if isinstance(n, ast.FunctionDef)
    } - {"__init__"}
    assert methods == {n for n in dir(_gpuprof.Profiler) if not n.startswith("_")}


# The one owner of a recording (issue 34): only these modules create or drive the C
# profiler, and only the profile reads its recording's insides.
OWNERS = {"gpuprof.record._recording", "gpuprof.api.profiler"}
PRIVATE = {"_core", "_rec", "_kept"}  # the C profiler, a profile's recording, its windows


def test_only_the_recording_touches_the_c_profiler():
    found = []
    for name, path in modules().items():
        if name in OWNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Attribute):
                continue
            if node.attr == "Profiler" and isinstance(node.value, ast.Name):
                if node.value.id == "_gpuprof":
                    found.append(f"{name}:{node.lineno} _gpuprof.Profiler")
            elif node.attr in PRIVATE:
                found.append(f"{name}:{node.lineno} .{node.attr}")
            elif node.attr == "register_at_fork":
                found.append(f"{name}:{node.lineno} os.register_at_fork")
    assert not found, (
        "go through gpuprof.record._recording (Recording, RecordingState, at_fork_in_child): "
        + ", ".join(found)
    )


def test_one_fork_handler():
    sources = {n: p.read_text() for n, p in modules().items()}
    assert [n for n, s in sources.items() if "register_at_fork(" in s] == [
        "gpuprof.record._recording"
    ]


def test_every_facade_is_an_attribute_of_a_fresh_import():
    """`import gpuprof; gpuprof.diagnose.diagnose(res)` works as it did before the
    facades: each public module path is reachable as an attribute, lazily."""
    names = sorted(
        n.split(".")[1]
        for n, path in modules().items()
        if n.count(".") == 1 and "sys.modules[__name__] = _impl" in path.read_text()
    )
    assert "diagnose" in names and "tables" in names
    code = (
        "import gpuprof, types, sys\n"
        f"for n in {names!r}:\n"
        "    m = getattr(gpuprof, n)\n"
        "    if not isinstance(m, types.ModuleType):\n"
        "        m = sys.modules['gpuprof.' + n]\n"
        "    assert m is sys.modules['gpuprof.' + n], n\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
