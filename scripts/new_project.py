"""Start a project from another one: `python scripts/new_project.py NAME [--from gpt] [--op OP]`.

Copies the source project's model (configs.py, model.py, train.py, __init__.py and every module of the project
they import, its ops/ among them) to projects/NAME/ with NAME where the source's name stood: the imports,
main("NAME"), the custom-op namespace (NAME::), the kernel names (NAME_..._kernel), the unknown-config error.
Writes a README to fill in, a throughput.csv with the header only, and tests/NAME/test_model.py (the model
contract, tests/core/test_contract.py, finds the project by itself). With --op OP it adds projects/NAME/ops/OP/
(naive.py: the PyTorch reference; triton.py: forward and backward kernels, their torch.library custom ops and
the autograd Function; __init__.py: the public entry and the op's kernel_scenarios()), the ops/__init__.py
kernel_scenarios() that scripts/compile_kernels.py calls, and tests/NAME/test_OP.py. The op is a placeholder
(silu(a) * b, elementwise) to replace with yours; the model does not call it until you make it.

Refuses to overwrite: nothing is written when projects/NAME or tests/NAME exists. The steps after this one:
projects/README.md, "Adding a project".

    python scripts/new_project.py mygpt --op swiglu
    python scripts/new_project.py my_lstm --from qlstm
"""
import ast
import keyword
import re
import shutil
import sys
import tempfile
from pathlib import Path
from string import Template

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from languini.flags import Parser  # noqa: E402  (after the path is set)
from languini.throughput import csv_text  # noqa: E402

NAME = re.compile(r"[a-z][a-z0-9_]*")
MODEL_FILES = ("__init__.py", "configs.py", "model.py", "train.py")


class ScaffoldError(ValueError):
    """Bad input to the scaffold (a name, a source project, an existing folder); nothing was written."""


def source_projects(root: Path) -> list[str]:
    """The projects a new one can start from: the language models (a model.py, configs.py and train.py)."""
    return sorted(p.name for p in (root / "projects").iterdir()
                  if all((p / f).is_file() for f in MODEL_FILES[1:]))


def check_name(name: str, what: str) -> None:
    if not NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ScaffoldError(f"{what} {name!r} is not a lowercase Python identifier (letters a-z, digits and _, "
                            f"starting with a letter, not a Python keyword), e.g. my_gpt")


def check_inputs(root: Path, name: str, source: str, op: str | None) -> None:
    check_name(name, "the project name")
    if op is not None:
        check_name(op, "--op")
    sources = source_projects(root)
    if source not in sources:
        raise ScaffoldError(f"unknown --from {source!r}: a new project starts from one of {', '.join(sources)}")
    for folder in (root / "projects" / name, root / "tests" / name):
        if folder.exists() or folder.is_symlink():
            raise ScaffoldError(f"{folder.relative_to(root)} already exists; choose another name or remove it "
                                "first (nothing was written)")
    if op is not None and (root / "projects" / source / "ops" / op).exists():
        raise ScaffoldError(f"projects/{source}/ops/{op} exists and is copied; choose another --op name")


# ---------------------------------------------------------------- copying the source project


def module_file(root: Path, module: str) -> Path | None:
    """The file of a module under root (a.b -> a/b.py or a/b/__init__.py), None when there is none."""
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_modules(text: str, where: str) -> set[str]:
    """The absolute module names a file imports (`from package import module` included), anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(text, where)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def model_closure(root: Path, source: str) -> list[Path]:
    """The source project's files its model needs: MODEL_FILES, the modules of the project they import
    (transitively), the packages' __init__.py on the way, and ops/__init__.py (its kernel_scenarios)."""
    folder = root / "projects" / source
    todo = [folder / f for f in MODEL_FILES]
    if (folder / "ops" / "__init__.py").is_file():
        todo.append(folder / "ops" / "__init__.py")
    found: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.add(path)
        for parent in path.parents:  # importing a.b.c runs a/__init__.py and a/b/__init__.py
            if parent == folder.parent:
                break
            if (parent / "__init__.py").is_file():
                todo.append(parent / "__init__.py")
        for module in imported_modules(path.read_text(), str(path)):
            if module == f"projects.{source}" or module.startswith(f"projects.{source}."):
                target = module_file(root, module)
                if target is not None:
                    todo.append(target)
    return sorted(found)


def renamed(text: str, source: str, name: str) -> str:
    """The source's text with `name` where the source project's name is repeated."""
    rules = [
        (rf"\bprojects([./]){source}\b", rf"projects\g<1>{name}"),  # imports and paths
        (rf"\btests/{source}\b", f"tests/{name}"),
        (rf"(['\"]){source}\1", rf"\g<1>{name}\g<1>"),  # main("source"), names in messages
        (rf"\b{source}::", f"{name}::"),  # the custom-op namespace
        (rf"\btorch\.ops\.{source}\.", f"torch.ops.{name}."),
        (rf"\b{source}_(?=\w*_kernel\b)", f"{name}_"),  # kernel names: <project>_<op>_..._kernel
        (r"Unknown [^'\"\n]*? config '", f"Unknown {name} config '"),  # configs.get's error
    ]
    for pattern, replacement in rules:
        text = re.sub(pattern, replacement, text)
    return text


def copy_op_tests(root: Path, source: str, name: str, project: Path, tests: Path) -> tuple[list[str], list[str]]:
    """Copy tests/<source>/test_<op>.py for each op copied to project (projects/<name> being built) when all it
    imports of the project was copied; return (the files copied, a note for each test left behind)."""

    def copied_module(module: str) -> bool:  # projects.<name>.a.b: a/b.py or a/b/__init__.py in the copy
        base = project.joinpath(*module.split(".")[2:])
        return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()

    copied, notes = [], []
    for op in sorted(p.parent.name for p in project.glob("ops/*/__init__.py")):
        test = root / "tests" / source / f"test_{op}.py"
        if not test.is_file():
            continue
        text = renamed(test.read_text(), source, name)
        imports = imported_modules(text, str(test))
        missing = sorted(m for m in imports if m.startswith((f"tests.{source}", f"tests.{name}")) or (
            m.startswith(f"projects.{name}.") and not copied_module(m) and not copied_module(m.rpartition(".")[0])))
        if missing:
            notes.append(f"tests/{source}/{test.name} not copied: it imports {', '.join(missing)}")
            continue
        (tests / test.name).write_text(text)
        copied.append(test.name)
    return copied, notes


def copy_model(root: Path, source: str, name: str, target: Path) -> list[str]:
    """Copy the model's files to target (projects/<name> being built); return their paths under it."""
    folder = root / "projects" / source
    written = []
    for path in model_closure(root, source):
        relative = path.relative_to(folder)
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / relative).write_text(renamed(path.read_text(), source, name))
        written.append(str(relative))
    for relative in written:  # projects never import each other: the copy must not reach back to its source
        leftover = {m for m in imported_modules((target / relative).read_text(), relative)
                    if m == f"projects.{source}" or m.startswith(f"projects.{source}.")}
        if leftover:
            raise RuntimeError(f"the copy of {relative} still imports {sorted(leftover)} (a bug of new_project.py)")
    return written


# ---------------------------------------------------------------- what is written new

README = Template('''\
# ${name}: (say in a line what the model is)

Started from [${source}](../${source}/README.md) by `${command}`:
until `model.py` changes it is ${source}'s model under a new name. Say here what it is, the paper it follows and
what differs from ${source}.

## Configs ([configs.py](configs.py))
The sizes copied from ${source}, and `cpu`, sized for a smoke test on a CPU with the embedded default corpus.

## Train
    python projects/${name}/train.py --compute_class 2m                # on a CPU: the cpu config, 2 minutes of it
    python projects/${name}/train.py --compute_class 6h --dry_run      # the plan (a GPU class needs a row: below)

## Measured
Nothing yet. `throughput.csv` has no row: a CPU class times the `cpu` model on the machine first; a GPU class needs
`python scripts/measure_throughput.py ${name} <config> --sweep --registry projects/${name}/throughput.csv` on the
reference GPU ([../README.md](../README.md), step 6). Each number written here names its command, the machine, the
date and the commit.

## Tests (`tests/${name}/`)
`python -m pytest -q tests/${name} tests/core/test_contract.py -k ${name}`: the model contract, and what is
specific to this model (add its paper's parameter counts and FLOPs, its kernels against their references).
''')

TEST_MODEL = Template('''\
"""${name}'s own tests; the model contract (shapes, state, causality, a near-uniform guess at init, optimiser
groups) is tests/core/test_contract.py's, which finds every project by itself. Add here what is specific to the
model: its paper's parameter counts and FLOPs, a hand-computed piece of its forward."""
from tests.core import test_contract, test_throughput


def test_the_core_tests_find_the_project():
    assert "${name}" in test_contract.PROJECTS and "${name}" in test_throughput.LANGUAGE_MODELS
''')

OPS_INIT = Template('''\
"""The Triton ops of ${name} (ops/<op>/); kernel_scenarios() launches their kernels as the model does."""


def kernel_scenarios():
    """Yield (description, callable) pairs that launch every kernel of ops/ (scripts/compile_kernels.py)."""
${yields}''')

OP_YIELD = Template('''\
    from projects.${name}.ops.${op} import kernel_scenarios as ${op}_scenarios  # added by new_project.py

    yield from ${op}_scenarios()
''')

OP_INIT = Template('''\
"""${op}: `${op}(a, b, impl)`; impl "naive" (naive.py, plain PyTorch: the reference and the CPU path) or
"triton" (triton.py, the kernels; None picks them for CUDA tensors).

A placeholder to replace with your op: silu(a) * b elementwise (the gate of a SwiGLU MLP), computed in fp32.
The FLOP profiler (languini/flops.py) sees neither path: a model calling it declares its FLOPs in
extra_flops(seq_len), the same on both paths.
"""
import torch

from languini.triton_utils import interpreting
from projects.${name}.ops.${op}.naive import ${op}_naive

IMPLS = ("naive", "triton")
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def ${op}(a: torch.Tensor, b: torch.Tensor, impl: str | None = None) -> torch.Tensor:
    """silu(a) * b elementwise, differentiable in a and b.

    Args:
        a, b: tensors of one shape, dtype and device (fp32, bf16 or fp16 for "triton").
        impl: "naive", "triton", or None for "triton" on CUDA tensors and "naive" otherwise.
    Returns:
        silu(a) * b in a's dtype, computed in fp32 (float64 for float64 inputs on the naive path).
    """
    impl = impl or ("triton" if a.is_cuda else "naive")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS} or None, not {impl!r}")
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"a and b must share shape, dtype and device, got {tuple(a.shape)} {a.dtype} {a.device} "
                         f"and {tuple(b.shape)} {b.dtype} {b.device}")
    if impl == "naive":
        return ${op}_naive(a, b)
    if a.dtype not in TRITON_DTYPES:
        raise ValueError(f"impl='triton' takes {TRITON_DTYPES}, got {a.dtype}; use impl='naive'")
    if not a.is_cuda and not interpreting():
        raise ValueError("impl='triton' on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported; "
                         "use impl='naive' on CPU")
    from projects.${name}.ops.${op}.triton import ${op}_triton  # the PyTorch path needs no Triton

    return ${op}_triton(a, b)


def kernel_scenarios():
    """Yield (description, callable) pairs launching every kernel of ${op} as a model would (compile_kernels.py):
    forward and backward in fp32 and bf16, at the width of the cpu config's MLP (4 x 128)."""
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(2, 37, 512, generator=g).to(dtype).requires_grad_() for _ in range(2))
        yield f"{dtype}", lambda a=a, b=b: ${op}(a, b, impl="triton").float().sum().backward()
''')

OP_NAIVE = Template('''\
"""${op} in plain PyTorch: the reference of the Triton kernels (triton.py) and the CPU path.

Written with torch.sigmoid and `*`, which the FLOP profiler does not count (F.silu it would), so that it sees
neither path and the model's extra_flops counts the op once for both (test_${op}.py checks it).
"""
import torch


def ${op}_naive(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b elementwise, computed in fp32 (float64 for float64 inputs), returned in a's dtype."""
    dtype = a.dtype
    a, b = (x.to(torch.promote_types(dtype, torch.float32)) for x in (a, b))
    return (a * torch.sigmoid(a) * b).to(dtype)
''')

OP_TRITON = Template('''\
"""${op} as Triton kernels (naive.py holds the reference): one program per BLOCK elements of the flattened
inputs, in fp32 whatever their dtype. The backward recomputes the sigmoid rather than saving it. The launches
are torch.library custom ops (${name}::${op}_forward, ${name}::${op}_backward), opaque to torch.compile;
${cls} gives them a gradient.
"""
import torch
import triton
import triton.language as tl

BLOCK = 1024  # elements per program


@triton.jit
def ${name}_${op}_fwd_kernel(a_ptr, b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offsets < n
    a = tl.load(a_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offsets, (a * tl.sigmoid(a) * b).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def ${name}_${op}_bwd_kernel(a_ptr, b_ptr, dy_ptr, da_ptr, db_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offsets < n
    a = tl.load(a_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    # d silu(a) / da = s + a * s * (1 - s)
    tl.store(da_ptr + offsets, (dy * b * s * (1 + a * (1 - s))).to(da_ptr.dtype.element_ty), mask=ok)
    tl.store(db_ptr + offsets, (dy * a * s).to(db_ptr.dtype.element_ty), mask=ok)


@torch.library.custom_op("${name}::${op}_forward", mutates_args=())
def ${op}_forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b from contiguous a and b of one shape and dtype."""
    y = torch.empty_like(a)
    n = a.numel()
    if n:
        ${name}_${op}_fwd_kernel[(triton.cdiv(n, BLOCK),)](a, b, y, n, BLOCK=BLOCK)
    return y


@${op}_forward.register_fake
def _(a, b):
    return torch.empty_like(a)


@torch.library.custom_op("${name}::${op}_backward", mutates_args=())
def ${op}_backward(a: torch.Tensor, b: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, db) from the forward's contiguous inputs and the contiguous output gradient."""
    da, db = torch.empty_like(a), torch.empty_like(b)
    n = a.numel()
    if n:
        ${name}_${op}_bwd_kernel[(triton.cdiv(n, BLOCK),)](a, b, dy, da, db, n, BLOCK=BLOCK)
    return da, db


@${op}_backward.register_fake
def _(a, b, dy):
    return torch.empty_like(a), torch.empty_like(b)


class ${cls}(torch.autograd.Function):

    @staticmethod
    def forward(ctx, a, b):
        a, b = a.contiguous(), b.contiguous()
        ctx.save_for_backward(a, b)
        return torch.ops.${name}.${op}_forward(a, b)

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        return torch.ops.${name}.${op}_backward(a, b, dy.contiguous())


def ${op}_triton(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b elementwise by the Triton kernels, differentiable in a and b.

    Args:
        a, b: tensors of one shape and dtype (fp32, bf16 or fp16), on CUDA (or on CPU under TRITON_INTERPRET=1).
    Returns:
        silu(a) * b in a's dtype, computed in fp32.
    """
    return ${cls}.apply(a, b)
''')

OP_TEST = Template('''\
"""${op} (projects/${name}/ops/${op}): both paths against float64 values computed another way, outputs and
gradients, on fresh random inputs of odd sizes; the Triton kernels run under the interpreter on CPU (conftest.py's
`device` fixture: LANGUINI_TEST_DEVICE=cuda runs them on a GPU)."""
import math

import pytest
import torch

from projects.${name}.ops.${op} import IMPLS, ${op}


def reference(a, b):
    """silu(a) * b in float64, written as a * b / (1 + exp(-a))."""
    return a * b / (1 + torch.exp(-a))


def outputs_and_gradients(function, a, b, dy):
    a, b = (x.detach().clone().requires_grad_() for x in (a, b))
    y = function(a, b)
    (y.to(dy.dtype) * dy).sum().backward()
    return [y, a.grad, b.grad]


SHAPES = [pytest.param((1,), id="1"), pytest.param((3, 5), id="3x5"), pytest.param((2, 37, 129), id="2x37x129")]
# fp32: a few roundings of values of order 1; bf16: the result rounded to 8 bits of mantissa (2^-8 relative)
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", [pytest.param(d, id=str(d).removeprefix("torch.")) for d in TOLERANCES])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("impl", IMPLS)
def test_outputs_and_gradients_match_float64(impl, shape, dtype, device):
    g = torch.Generator().manual_seed(math.prod(shape))
    a, b, dy = (torch.randn(shape, generator=g).mul(3).to(dtype) for _ in range(3))
    got = outputs_and_gradients(lambda a, b: ${op}(a, b, impl), a.to(device), b.to(device), dy.to(device))
    want = outputs_and_gradients(reference, a.double(), b.double(), dy.double())
    assert [x.dtype for x in got] == [dtype] * 3
    tol = TOLERANCES[dtype]
    for what, x, w in zip(("y", "da", "db"), got, want):
        torch.testing.assert_close(x.cpu().double(), w, rtol=tol, atol=tol * w.abs().max().item(),
                                   msg=lambda m: f"{impl} {what}: {m}")


@pytest.mark.parametrize("impl", IMPLS)
def test_hand_computed_example(impl, device):
    # a = ln 3: sigmoid(a) = 3/4, silu(a) = 3/4 ln 3, d silu/da = 3/4 + ln 3 * 3/4 * 1/4; a = 0: silu 0, slope 1/2
    a = torch.tensor([math.log(3.0), 0.0], device=device, requires_grad=True)
    b = torch.tensor([2.0, 5.0], device=device, requires_grad=True)
    y = ${op}(a, b, impl)
    y.sum().backward()
    expected = [[1.5 * math.log(3.0), 0.0], [2 * (0.75 + 3 / 16 * math.log(3.0)), 2.5], [0.75 * math.log(3.0), 0.0]]
    for x, want in zip((y, a.grad, b.grad), expected):
        torch.testing.assert_close(x.cpu(), torch.tensor(want), rtol=1e-6, atol=1e-6)


def test_custom_ops_are_registered_for_torch_compile(device):
    from projects.${name}.ops.${op} import triton  # noqa: F401  (registers the ops)

    a, b, dy = (torch.randn(3, 7, device=device) for _ in range(3))
    torch.library.opcheck(torch.ops.${name}.${op}_forward, (a, b))
    torch.library.opcheck(torch.ops.${name}.${op}_backward, (a, b, dy))


@pytest.mark.parametrize("impl", IMPLS)
def test_the_flop_profiler_sees_neither_path(impl):
    # A model's FLOPs are the profiler's count plus its extra_flops(): a path the profiler half-saw (F.silu is
    # counted, `*` is not) would charge the CPU and the GPU runs of one model differently.
    from languini.flops import forward_flops

    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(8, 4)

        def forward(self, x):
            h = self.embed(x)
            return ${op}(h, h, impl)

    assert forward_flops(Gate(), 6, 8) == 0


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="impl must be one of"):
        ${op}(torch.ones(2), torch.ones(2), "cuda")
    with pytest.raises(ValueError, match="share shape"):
        ${op}(torch.ones(2), torch.ones(3))
''')


def write_op(target_project: Path, target_tests: Path, name: str, op: str, copied_ops_init: bool) -> list[str]:
    """The op's folder, its test and ops/__init__.py's kernel_scenarios (added to a copied one)."""
    values = {"name": name, "op": op, "cls": "".join(w.capitalize() for w in op.split("_")) + "Function"}
    folder = target_project / "ops" / op
    folder.mkdir(parents=True)
    for file, template in (("__init__.py", OP_INIT), ("naive.py", OP_NAIVE), ("triton.py", OP_TRITON)):
        (folder / file).write_text(template.substitute(values))
    ops_init = target_project / "ops" / "__init__.py"
    yields = OP_YIELD.substitute(values)
    if copied_ops_init:  # the source's kernel_scenarios() also yields the new op's launches
        lines = ops_init.read_text().splitlines(keepends=True)
        [function] = [node for node in ast.parse("".join(lines)).body
                      if isinstance(node, ast.FunctionDef) and node.name == "kernel_scenarios"]
        ops_init.write_text("".join(lines[:function.end_lineno]) + "\n" + yields + "".join(lines[function.end_lineno:]))
    else:
        ops_init.write_text(OPS_INIT.substitute(values, yields=yields))
    (target_tests / f"test_{op}.py").write_text(OP_TEST.substitute(values))
    return [f"ops/{op}/__init__.py", f"ops/{op}/naive.py", f"ops/{op}/triton.py", "ops/__init__.py"]


def scaffold(root: Path, name: str, source: str = "gpt", op: str | None = None) -> tuple[list[str], list[str]]:
    """Write projects/<name>/ and tests/<name>/ under root; return (the files written, relative to root, and a
    note for each test of a copied op left behind).

    Both folders are built beside their final place and renamed into it, so an error leaves neither behind.
    """
    check_inputs(root, name, source, op)
    command = " ".join(["python scripts/new_project.py", name, *(["--from", source] if source != "gpt" else []),
                        *(["--op", op] if op else [])])
    project, tests = root / "projects" / name, root / "tests" / name
    staged_project = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=project.parent))
    staged_tests = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=tests.parent))
    moved = []
    try:
        files = copy_model(root, source, name, staged_project)
        (staged_project / "README.md").write_text(README.substitute(name=name, source=source, command=command))
        (staged_project / "throughput.csv").write_text(csv_text([]))
        files += ["README.md", "throughput.csv"]
        (staged_tests / "__init__.py").write_text("")
        (staged_tests / "test_model.py").write_text(TEST_MODEL.substitute(name=name))
        test_files = ["__init__.py", "test_model.py"]
        copied_tests, notes = copy_op_tests(root, source, name, staged_project, staged_tests)
        test_files += copied_tests
        if op is not None:
            files += write_op(staged_project, staged_tests, name, op, "ops/__init__.py" in files)
            test_files.append(f"test_{op}.py")
        for staged, final in ((staged_project, project), (staged_tests, tests)):
            staged.chmod(0o755)  # mkdtemp's folders are private
            staged.rename(final)
            moved.append(final)
    except BaseException:
        for folder in (staged_project, staged_tests, *moved):
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return [f"projects/{name}/{f}" for f in sorted(set(files))] + [f"tests/{name}/{f}" for f in test_files], notes


def next_steps(name: str, source: str, op: str | None, root: Path = ROOT) -> str:
    steps = [
        f"python -m pytest -q tests/{name} tests/core/test_contract.py -k {name}   # its tests and the model contract",
        f"python projects/{name}/train.py --compute_class 2m   # on a CPU: times the cpu model here, then trains 2 min",
        f"edit projects/{name}/model.py (and configs.py); say what the model is in projects/{name}/README.md",
    ]
    if "languini.transformer" in (root / "projects" / source / "model.py").read_text():
        steps[-1] += (" (the GPT's blocks stay languini/transformer.py's: a feed-forward of your own goes in "
                      "through GPT(cfg, make_block) and Block(cfg, ff), as projects/lram_gpt/model.py does)")
    if op is not None:
        steps += [f"replace silu(a) * b in projects/{name}/ops/{op}/ by your op (naive.py, triton.py, the tests in "
                  f"tests/{name}/test_{op}.py), call it from model.py, and declare the kernels' FLOPs in extra_flops",
                  f"python scripts/compile_kernels.py --project {name} --arch 90   # the kernels compile for a GPU"]
    steps += [f"on the reference GPU: python scripts/measure_throughput.py {name} <config> --sweep --registry "
              f"projects/{name}/throughput.csv, then commit the row",
              f"git add projects/{name} tests/{name} && git commit   # and a row in README.md's project table",
              "the whole checklist: projects/README.md"]
    return "\n".join(f"  {i}. {step}" for i, step in enumerate(steps, 1))


def main(argv=None, root: Path = ROOT) -> list[str]:
    parser = Parser(description=__doc__.split("\n\n")[0], epilog="the checklist: projects/README.md")
    parser.add_argument("name", help="the new project's name: projects/<name>/, a lowercase Python identifier")
    parser.add_argument("--from", dest="source", default="gpt",
                        help="the project to start from (default gpt, the baseline)")
    parser.add_argument("--op", default=None, help="also write the skeleton of a Triton op of this name")
    args = parser.parse_args(argv)
    try:
        files, notes = scaffold(root, args.name, args.source, args.op)
    except ScaffoldError as error:
        parser.exit(2, f"new_project.py: {error}\n")
    print(f"Created {len(files)} files from projects/{args.source}:")
    print("\n".join(f"  {f}" for f in files + notes))
    print("Next steps:")
    print(next_steps(args.name, args.source, args.op, root))
    return files


if __name__ == "__main__":
    main()
