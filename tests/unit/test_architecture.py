"""The package's architecture, checked: every module of python/gpuprof has a layer,
imports only from its own layer or below, and no import cycle exists. Every import
counts, at module level or inside a function (a deferred import still ties the two
modules together). docs/architecture.md explains the layers.

A new module gets a line in LAYERS; an import that this test refuses means the
imported thing belongs lower (move it down) or the importer belongs higher.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "python" / "gpuprof"

# Lowest first. A module may import from its own layer and the layers before it.
LAYER_ORDER = ["core", "recording", "results", "analysis", "exporters", "api", "cli"]
LAYERS = {
    # core: the extension and small helpers every layer shares (no gpuprof imports
    # except the extension and each other)
    "gpuprof._gpuprof": "core",
    "gpuprof._version": "core",
    "gpuprof._constants": "core",
    "gpuprof._format": "core",
    "gpuprof._intervals": "core",
    "gpuprof._paths": "core",
    "gpuprof._progress": "core",
    "gpuprof._ranks": "core",
    "gpuprof._output": "core",
    "gpuprof._window_file": "core",
    "gpuprof._trace_read": "core",
    "gpuprof._spans": "core",
    "gpuprof._steps": "core",
    "gpuprof._launch": "core",
    "gpuprof._flops": "core",
    "gpuprof._peaks": "core",
    "gpuprof._ondemand._proto": "core",
    "gpuprof.boot": "core",
    # recording: the parts a profile composes (CUDA, NVTX, sys.monitoring, schedule,
    # samplers, child processes)
    "gpuprof.schedule": "recording",
    "gpuprof._cuda": "recording",
    "gpuprof._nvtx": "recording",
    "gpuprof._monitoring": "recording",
    "gpuprof._host_sampler": "recording",
    "gpuprof._allocators": "recording",
    "gpuprof._recording": "recording",
    "gpuprof._parts": "recording",
    "gpuprof._threads": "recording",
    "gpuprof._autograd": "recording",
    "gpuprof._modules": "recording",
    "gpuprof._module_rows": "results",
    "gpuprof._subprocess": "recording",
    "gpuprof._subprocess._current": "recording",
    "gpuprof._subprocess._protocol": "recording",
    "gpuprof._subprocess._pieces": "recording",
    "gpuprof._subprocess._child": "recording",
    "gpuprof._subprocess._hooks": "recording",
    "gpuprof._subprocess._parent": "recording",
    "gpuprof._ondemand._capture": "recording",
    # results: the arrays from C and what reads them directly
    "gpuprof._results": "results",
    "gpuprof._backward": "results",
    "gpuprof.occupancy": "results",
    "gpuprof.tables": "results",
    "gpuprof.views": "results",
    "gpuprof.events": "results",
    "gpuprof._findings": "results",
    # analysis: figures and findings computed from results
    "gpuprof.processes": "analysis",
    "gpuprof.memory": "analysis",
    "gpuprof.distributed": "analysis",
    "gpuprof.distributed._overlap": "analysis",
    "gpuprof.distributed._traces": "analysis",
    "gpuprof.distributed._merged": "analysis",
    "gpuprof.distributed._checks": "analysis",
    "gpuprof.diagnose": "analysis",
    "gpuprof._comparison": "analysis",
    "gpuprof._deepdive": "analysis",
    "gpuprof._deepdive._report": "analysis",
    "gpuprof._deepdive._cupti": "analysis",
    "gpuprof._deepdive._ncu": "analysis",
    # exporters: files written from results and analyses
    "gpuprof.exporters.chrome": "exporters",
    "gpuprof.exporters.stacks": "exporters",
    "gpuprof.exporters.tensorboard": "exporters",
    "gpuprof.exporters.saved": "exporters",
    "gpuprof.exporters.html": "exporters",
    # api: the objects users hold (a live or loaded profile answers every call of
    # the layers below through one accessor class) and the facades that name them
    "gpuprof._accessors": "api",
    "gpuprof.profiler": "api",
    "gpuprof._loaded": "api",
    "gpuprof.deepdive": "api",
    "gpuprof.compare": "api",
    "gpuprof._ondemand": "api",
    "gpuprof._ondemand._armed": "api",
    "gpuprof._ondemand._captures": "api",
    "gpuprof._ondemand._requests": "api",
    "gpuprof._ondemand._environment": "api",
    "gpuprof._ondemand._shared": "api",
    "gpuprof._ondemand._dump": "api",
    "gpuprof._ondemand._summary": "api",
    "gpuprof.exporters": "api",
    "gpuprof": "api",
    # cli: programs and framework adapters on top of the public API
    "gpuprof.cli": "cli",
    "gpuprof.cli.__main__": "cli",
    "gpuprof.cli._common": "cli",
    "gpuprof.cli._run": "cli",
    "gpuprof.cli._report": "cli",
    "gpuprof.cli._capture": "cli",
    "gpuprof.cli._dump": "cli",
    "gpuprof.cli._top": "cli",
    "gpuprof.__main__": "cli",
    "gpuprof._ondemand._client": "cli",
    "gpuprof._ondemand._targets": "cli",
    "gpuprof._ondemand._exchange": "cli",
    "gpuprof._ondemand._dump_client": "cli",
    "gpuprof._ondemand._top": "cli",
    "gpuprof.demo": "cli",
    "gpuprof.workloads": "cli",
    "gpuprof.workloads.training": "cli",
    "gpuprof._boot.sitecustomize": "cli",
    "gpuprof.integrations": "cli",
    "gpuprof.integrations._session": "cli",
    "gpuprof.integrations._lightning": "cli",
    "gpuprof.integrations.lightning": "cli",
    "gpuprof.integrations.pytorch_lightning": "cli",
    "gpuprof.integrations.transformers": "cli",
    "gpuprof.integrations.accelerate": "cli",
}

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
    missing = sorted(set(modules()) - set(LAYERS))
    assert not missing, f"give these modules a layer in LAYERS: {missing}"
    gone = sorted(set(LAYERS) - set(modules()) - {"gpuprof._gpuprof"})
    assert not gone, f"LAYERS names modules that no longer exist: {gone}"


def test_every_import_names_a_module():
    g = graph()
    unknown = {(a, b) for a, deps in g.items() for b in deps if b not in LAYERS}
    assert not unknown, f"imports of modules that do not exist: {sorted(unknown)}"


def test_imports_go_down_the_layers():
    g = graph()
    rank = {name: LAYER_ORDER.index(layer) for name, layer in LAYERS.items()}
    upward = {(a, b) for a, deps in g.items() for b in deps if b in rank and rank[b] > rank[a]}
    new = sorted(upward - set(KNOWN_UPWARD))
    assert not new, (
        "upward imports ("
        + ", ".join(f"{a} [{LAYERS[a]}] -> {b} [{LAYERS[b]}]" for a, b in new)
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
    """gpuprof._constants reads them from the extension; the extension's own test
    table (built from the same enums) agrees."""
    from gpuprof import _constants, _gpuprof

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
NOT_ENUMS = {"gpuprof.distributed._traces._GPU_TID_BASE"}  # a lane numbering of merged traces


def test_no_module_copies_a_c_enum_value():
    """A module-level name spelled like a C enum constant and bound to a number
    literal is a copy: import it from gpuprof._constants instead."""
    copies = []
    for name, path in modules().items():
        if name == "gpuprof._constants":
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
OWNERS = {"gpuprof._recording", "gpuprof.profiler"}
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
        "go through gpuprof._recording (Recording, RecordingState, at_fork_in_child): "
        + ", ".join(found)
    )


def test_one_fork_handler():
    sources = {n: p.read_text() for n, p in modules().items()}
    assert [n for n, s in sources.items() if "register_at_fork(" in s] == ["gpuprof._recording"]
