"""The import structure of the code: languini/ never imports a project, projects never import each other, and no
module of either imports itself back through a chain of others. Every import statement counts, also those inside
functions or under `if __name__ == "__main__"` (projects.switch_gpt.configs once printed its sizes through
projects.switch_gpt.model, which imports configs: a circle)."""
import ast

import pytest

from languini.experiment import REPO_ROOT


def module_name(path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(files) -> dict[str, set[str]]:
    """Module -> the modules of `files` it imports (absolute imports, `from package import module` included)."""
    modules = {module_name(path): path for path in files}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles a depth-first search meets, each as a path that ends where it starts (none: no cycle)."""
    found, state = [], {}  # state: 1 while a module is on the current path, 2 once all it imports are searched

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph(sorted(REPO_ROOT.glob("languini/**/*.py")) + sorted(REPO_ROOT.glob("projects/**/*.py")))


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_projects_never_import_each_other_and_the_core_no_project(graph):
    crossing = [(m, t) for m, targets in graph.items() for t in targets
                if t.startswith("projects.") and (m.startswith("languini") or m.split(".")[1] != t.split(".")[1])]
    assert crossing == []
