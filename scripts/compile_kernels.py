"""Compile every Triton kernel the projects launch for real GPUs, on any machine, GPU or not.

The tests run the kernels under the Triton interpreter, which accepts programs the compiler rejects and
says nothing about registers, spills or shared memory. This script first runs each project's kernel
entry points under the interpreter on tiny inputs at model widths (bf16 autocast and fp32, every
value-gradient variant) and records each distinct launch: the argument types and the compile-time
constants. It then compiles those launches for the chosen architectures down to a cubin (Triton ships
ptxas; no GPU or driver is needed) and prints a table of registers, spilled bytes and shared memory.
Each project owns its scenarios: kernel_scenarios() in projects/<p>/ops/__init__.py, for every project with
an ops/<op>/triton.py; the core's ops (languini/ops/<op>/triton.py, those several projects read) are compiled as
one more project named "languini", its scenarios in languini/ops/__init__.py.

    python scripts/compile_kernels.py                       # all projects, sm_90 (H100/H200) and sm_80 (A100)
    python scripts/compile_kernels.py --project lram_gpt --arch 90 --csv compiled.csv

Exits with 1 when a kernel fails to compile, after printing the compiler's error.
"""

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from languini.experiment import child_python_path
from languini.flags import Parser

ROOT = Path(__file__).resolve().parents[1]
# a Triton kernel: a jit function (perhaps under further decorators) whose name ends in _kernel
KERNEL_DEFINITION = re.compile(r"^@triton\.jit[^\n]*\n(?:@[^\n]*\n)*def (\w+_kernel)\(", re.MULTILINE)
CORE = "languini"  # the core's kernels (languini/ops/<op>/triton.py), compiled as one more project
# the projects with Triton kernels: projects/<p>/ops/<op>/triton.py, and the core when it has any
PROJECTS = ((CORE,) if any(ROOT.glob("languini/ops/*/triton.py")) else ()) + tuple(
    sorted({path.parents[2].name for path in ROOT.glob("projects/*/ops/*/triton.py")}))
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")  # a launch's compile options, not arguments
DTYPE_NAMES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16",
               "torch.int64": "i64", "torch.int32": "i32", "torch.int16": "i16", "torch.int8": "i8",
               "torch.uint8": "u8", "torch.bool": "u1"}


# ---------------------------------------------------------------- recording (under the interpreter)


def ops_folder(project):
    """The folder of a project's ops: projects/<project>/ops, or languini/ops for the core."""
    return ROOT / "languini" / "ops" if project == CORE else ROOT / "projects" / project / "ops"


def ops_package(project):
    """The package of a project's ops (its kernel_scenarios() and kernel_cost_spec())."""
    return "languini.ops" if project == CORE else f"projects.{project}.ops"


def project_kernels(project):
    """The names of the Triton kernels (jit functions named *_kernel) defined in the project's ops/*/."""
    names = set()
    for source in sorted(ops_folder(project).glob("*/*.py")):
        names |= set(KERNEL_DEFINITION.findall(source.read_text()))
    return names


def _scenarios(project):
    """Yield (description, callable) pairs that launch the project's kernels as its model does: the project's
    own kernel_scenarios() in its ops/__init__.py."""
    import importlib

    ops = importlib.import_module(ops_package(project))
    if not hasattr(ops, "kernel_scenarios"):
        raise SystemExit(f"{ops_folder(project).relative_to(ROOT)}/__init__.py defines kernels but no "
                         "kernel_scenarios(); add one "
                         "that launches each kernel as the model does (see projects/qlstm/ops/__init__.py)")
    yield from ops.kernel_scenarios()


def _argument_type(value):
    """Triton's signature entry and divisibility-by-16 for one launch argument, as its JIT specialises it."""
    import torch

    if isinstance(value, torch.Tensor):
        return "*" + DTYPE_NAMES[str(value.dtype)], value.data_ptr() % 16 == 0
    if isinstance(value, bool):
        return "i1", False
    if isinstance(value, int):
        return ("i32" if -2 ** 31 <= value < 2 ** 31 else "i64"), value % 16 == 0
    if isinstance(value, float):
        return "fp32", False
    raise TypeError(f"cannot record a launch argument of type {type(value).__name__}")


def record(project):
    """Run the project's scenarios under the interpreter; return its distinct kernel launches."""
    import inspect

    from triton.runtime.interpreter import InterpretedFunction

    launches = {}
    original_run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        options = {name: kwargs.pop(name) for name in LAUNCH_OPTIONS if name in kwargs}
        bound = inspect.signature(self.fn).bind(*args, **kwargs)
        signature, constants, aligned = {}, {}, []
        for position, (name, parameter) in enumerate(inspect.signature(self.fn).parameters.items()):
            value = bound.arguments.get(name, parameter.default)
            # a None pointer (an unused buffer) is specialised as a constant, as the JIT does
            if "constexpr" in str(parameter.annotation) or value is None:
                # UPCAST is the interpreter's bf16 workaround (load bf16, compute in fp32): off on a GPU
                signature[name], constants[name] = "constexpr", False if name == "UPCAST" else value
                continue
            signature[name], divisible = _argument_type(value)
            if divisible:
                aligned.append(position)
        launch = {"module": self.fn.__module__, "kernel": self.fn.__name__, "signature": signature,
                  "constants": constants, "aligned": aligned, "options": options}
        launches.setdefault(json.dumps(launch, sort_keys=True), launch)
        return original_run(self, *args, grid=grid, warmup=warmup, **kwargs, **options)

    InterpretedFunction.run = recording_run
    try:
        for description, scenario in _scenarios(project):
            try:
                scenario()
            except Exception as error:
                raise RuntimeError(f"{project}: the scenario '{description}' failed") from error
    finally:
        InterpretedFunction.run = original_run
    return list(launches.values())


# ---------------------------------------------------------------- compiling (no interpreter)


def _resource_usage(cubin: bytes) -> dict:
    """Registers, stack and local (spill) bytes of a cubin, read by the cuobjdump that ships with Triton."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        report = subprocess.run([str(tool), "-res-usage", file.name], capture_output=True, text=True, check=True)
    usage = {}
    for field in report.stdout.split():
        name, _, value = field.partition(":")
        if name in ("REG", "STACK", "LOCAL") and value.isdigit():
            usage[name.lower()] = int(value)
    return usage


def compile_to_cubin(launch, arch):
    """Compile one recorded launch for sm_<arch>: Triton's compiled kernel (cubin in .asm["cubin"])."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = getattr(importlib.import_module(launch["module"]), launch["kernel"])
    while not isinstance(kernel, triton.runtime.JITFunction):  # @triton.heuristics wraps the jitted function
        kernel = kernel.fn
    attrs = {(position,): [["tt.divisibility", 16]] for position in launch["aligned"]}
    source = ASTSource(fn=kernel, signature=launch["signature"], constexprs=launch["constants"], attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=launch.get("options") or None)


def compile_launch(launch, arch):
    """Compile one recorded launch for sm_<arch>; a dict of its resources (or of its error)."""
    start = time.perf_counter()
    try:
        compiled = compile_to_cubin(launch, arch)
    except Exception as error:  # report every kernel's outcome, then fail at the end
        return {"error": f"{type(error).__name__}: {error}"}
    return {"seconds": time.perf_counter() - start, "shared": compiled.metadata.shared,
            "warps": compiled.metadata.num_warps, **_resource_usage(compiled.asm["cubin"])}


def recorded_launches(project):
    """The project's distinct kernel launches, recorded by a child process under the interpreter.

    The interpreter is chosen when a kernel is defined, so the caller (which compiles) must never see it:
    call prepare_compiling() first.
    """
    child_env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": child_python_path()}
    with tempfile.TemporaryDirectory() as scratch:
        launches_file = Path(scratch) / "launches.json"
        recorded = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--record", project,
                                   str(launches_file)], env=child_env, capture_output=True, text=True)
        if recorded.returncode:
            print(recorded.stdout + recorded.stderr, file=sys.stderr)
            if "only 0-dimensional arrays" in recorded.stderr:
                print("Triton < 3.8's interpreter needs NumPy < 2.4 (pip install 'numpy<2.4')", file=sys.stderr)
            raise SystemExit(f"recording the launches of {project} failed")
        return json.loads(launches_file.read_text())


def prepare_compiling():
    """Switch the interpreter off in this process and make the projects importable."""
    os.environ.pop("TRITON_INTERPRET", None)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def _constants_text(constants):
    return " ".join(f"{name}={value}" for name, value in constants.items() if value is not None)


def _pointer_dtypes(signature):
    return ",".join(sorted({kind[1:] for kind in signature.values() if kind.startswith("*")}))


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", choices=PROJECTS, action="append",
                        help="project whose kernels to compile; repeat for several (default: all)")
    parser.add_argument("--arch", type=int, action="append",
                        help="CUDA compute capability as one number, e.g. 90 for H100/H200 (default: 90 and 80)")
    parser.add_argument("--csv", type=Path, help="also write the table to this CSV file")
    # internal: the interpreter child process records one project's launches into a JSON file
    parser.add_argument("--record", nargs=2, metavar=("PROJECT", "JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.record:
        project, path = args.record
        Path(path).write_text(json.dumps(record(project)))
        return 0

    projects, archs = args.project or list(PROJECTS), args.arch or [90, 80]
    prepare_compiling()
    import triton

    rows, failed = [], False
    for project in projects:
        print(f"{project}: recording its kernel launches under the interpreter", file=sys.stderr, flush=True)
        launches = recorded_launches(project)
        print(f"{project}: compiling {len(launches)} launches for {', '.join(f'sm_{a}' for a in archs)}",
              file=sys.stderr, flush=True)
        for launch in launches:
            for arch in archs:
                result = compile_launch(launch, arch)
                failed |= "error" in result
                rows.append({"project": project, "kernel": launch["kernel"], "triton": triton.__version__,
                             "arch": f"sm_{arch}",
                             "pointers": _pointer_dtypes(launch["signature"]),
                             "constants": _constants_text(launch["constants"]), **result})

    print(f"Triton {triton.__version__}; registers per thread, spilled (local) bytes per thread, shared "
          f"memory per program; warps = threads per program / 32")
    header = f"{'kernel':<42}{'arch':<7}{'pointers':<18}{'regs':>5}{'spill':>6}{'shared':>8}{'warps':>6}{'s':>6}  constants"
    print(header)
    print("-" * len(header))
    for row in rows:
        name = f"{row['project']}.{row['kernel']}"
        if "error" in row:
            print(f"{name:<42}{row['arch']:<7}FAILED: {row['error']}")
            continue
        print(f"{name:<42}{row['arch']:<7}{row['pointers']:<18}{row['reg']:>5}{row['local']:>6}{row['shared']:>8}"
              f"{row['warps']:>6}{row['seconds']:>6.1f}  {row['constants']}")
    spilling = [row for row in rows if row.get("local")]
    if spilling:
        print(f"\n{len(spilling)} compiled launches spill registers to local memory (column 'spill').")
    if args.csv:
        fields = ["project", "kernel", "triton", "arch", "pointers", "constants", "reg", "local", "stack", "shared", "warps",
                  "seconds", "error"]
        with open(args.csv, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
