"""The code's shape, checked: short functions, `__init__.py` files that only re-export, only commands print.

The import contracts themselves (who may import whom) are in pyproject.toml `[tool.importlinter]` and
run by `make test` (`lint-imports`); these are the rules import-linter cannot express.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "powertrain"
MAX_LINES = 80
# A function may be longer when a comment in its first lines says why it must be one piece.
LONG_MARK = "# long function:"
# Processes' own entry points (not the library): what they print is their output.
ENTRY_POINTS = {"cli", "workload/train.py", "workload/equivalence.py", "launch/gpu_check.py"}


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _rel(p: Path) -> str:
    return p.relative_to(SRC).as_posix()


def test_no_function_is_longer_than_80_lines_without_saying_why() -> None:
    too_long = []
    for path in _modules():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            head = "\n".join(lines[node.lineno - 1: node.lineno + 5])
            if length > MAX_LINES and LONG_MARK not in head:
                too_long.append(f"{_rel(path)}:{node.lineno} {node.name} ({length} lines)")
    assert not too_long, (f"functions over {MAX_LINES} lines without a '{LONG_MARK} <reason>' comment in their "
                          "first lines: " + "; ".join(too_long))


def _is_reexport(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
        return True  # docstring
    if isinstance(stmt, ast.Assign | ast.AnnAssign):
        value = stmt.value
        return value is None or isinstance(value, ast.Constant | ast.List | ast.Tuple | ast.Name | ast.Attribute)
    if isinstance(stmt, ast.If):  # `if TYPE_CHECKING:` blocks of imports
        return all(_is_reexport(s) for s in stmt.body + stmt.orelse)
    return False


@pytest.mark.parametrize("init", sorted(SRC.rglob("__init__.py")), ids=lambda p: _rel(p))
def test_init_files_only_re_export(init: Path) -> None:
    body = ast.parse(init.read_text()).body
    logic = [f"line {s.lineno}: {type(s).__name__}" for s in body if not _is_reexport(s)]
    assert not logic, f"{_rel(init)} holds logic ({', '.join(logic)}); move it into a named module"


def test_only_commands_print() -> None:
    """Library code reports through `logging`; printing belongs to the CLI and process entry points."""
    offenders = []
    for path in _modules():
        rel = _rel(path)
        if rel.split("/")[0] in ENTRY_POINTS or rel in ENTRY_POINTS or path.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name) and f.id == "print":
                offenders.append(f"{rel}:{node.lineno} print()")
            elif (isinstance(f, ast.Attribute) and f.attr == "write" and isinstance(f.value, ast.Attribute)
                  and f.value.attr in {"stderr", "stdout"}):
                offenders.append(f"{rel}:{node.lineno} sys.{f.value.attr}.write()")
    assert not offenders, "library code prints (use logging): " + "; ".join(offenders)


def test_the_bottom_layers_contracts_name_every_top_level_module() -> None:
    """import-linter's forbidden lists are explicit: a new top-level module must join them, or the
    bottom layers could start importing it without a contract noticing."""
    import tomllib

    conf = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())["tool"]["importlinter"]
    tops = {f"powertrain.{p.stem if p.is_file() else p.name}" for p in SRC.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    allowed = {"core": {"powertrain.core"}, "schema": {"powertrain.core", "powertrain.schema"},
               "store": {"powertrain.core", "powertrain.schema", "powertrain.store"}}
    for contract in conf["contracts"]:
        if contract["id"] in allowed:
            missing = tops - allowed[contract["id"]] - set(contract["forbidden_modules"])
            assert not missing, f"contract {contract['id']!r} does not forbid {sorted(missing)}"
