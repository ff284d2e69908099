"""Static cost of the Triton kernels, read from their compiled SASS: no GPU needed.

compile_kernels.py records every kernel launch the projects make (under the interpreter) and compiles it
for a GPU architecture. This script compiles the same launches, disassembles each cubin with the
cuobjdump that ships with Triton, and prints per launch:
- registers, spilled bytes, shared memory and the theoretical occupancy on the target (sm_90: 64 warps,
  32 blocks, 64K registers, 228 KiB shared memory per SM);
- the instruction mix of the whole kernel and of its hottest loop (the loop with the largest trip count):
  shuffles (SHFL), barriers (BAR), fences (MEMBAR), atomics (ATOM*/RED*), global loads by width (LDG);
- for the memory layers' kernels (LRAM's lookup, PKM's search and bag), warp-instructions per lookup: every
  SASS instruction counted once per execution (loops by their trip counts, known from the launch or, for the
  LRAM forward's data-dependent selection loop, the mean over random queries from the reference emulation),
  summed over the warps of a program and divided by the lookups a program serves (each project's
  kernel_cost_spec() says what a lookup is); beside it the bytes a lookup must move to or from HBM;
- then the bound table: per lookup, the time an H100 SXM needs to issue those instructions (132 SMs x 4
  schedulers x ~1.75 GHz = 0.92e12 warp-instructions/s) and to move those bytes (3.35 TB/s), which of the two
  bounds the kernel and by what margin (the larger over the smaller): a model from spec-sheet numbers, not a
  measurement.

    python scripts/kernel_cost.py                                   # LRAM and PKM kernels, sm_90
    python scripts/kernel_cost.py --project lram_gpt --csv costs.csv
    python scripts/kernel_cost.py --csv projects/lram_gpt/kernel_cost.csv   # the committed table

Branches inside a loop count both sides (an upper bound); a loop the spec below does not know counts once; the
padding after the last EXIT (a branch to itself and NOPs) counts none.
"""

import argparse
import csv
import math
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compile_kernels  # noqa: E402  (a sibling script, not a package)

from languini.flags import Parser  # noqa: E402

# An H100 SXM from its spec sheet (not measured): 132 SMs x 4 schedulers issuing one warp-instruction per clock
# at ~1.75 GHz (the clock it holds under load, below the 1.98 GHz boost): 0.92e12 warp-instructions/s; 3.35 TB/s
# of HBM3.
H100_WARP_INSTRUCTIONS_PER_S = 132 * 4 * 1.75e9
H100_HBM_BYTES_PER_S = 3.35e12
# Per-SM limits of sm_80/sm_90 for the occupancy (CUDA occupancy calculator's rules).
SM_LIMITS = {
    80: dict(warps=64, blocks=32, registers=65536, shared=167936),
    90: dict(warps=64, blocks=32, registers=65536, shared=233472),
}
REGISTER_GRANULE = 256  # registers are allocated per warp in units of 256
SHARED_RESERVED_PER_BLOCK = 1024

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);")


@dataclass
class Instruction:
    address: int
    opcode: str  # without modifiers, e.g. LDG
    modifiers: str  # e.g. .E.128.CONSTANT
    operands: str


@dataclass
class Mix:
    """Counts of one group of instructions (weighted by how often each runs where that is known)."""
    total: float = 0
    shuffles: float = 0
    barriers: float = 0
    fences: float = 0
    atomics: float = 0
    local: float = 0  # LDL/STL: registers spilled to local memory
    global_loads: dict = field(default_factory=dict)  # width in bits -> count

    def add(self, instruction: Instruction, times: float = 1):
        self.total += times
        opcode = instruction.opcode
        if opcode == "SHFL":
            self.shuffles += times
        elif opcode == "BAR":
            self.barriers += times
        elif opcode == "MEMBAR":
            self.fences += times
        elif opcode in ("ATOM", "ATOMG", "RED", "REDG", "ATOMS"):
            self.atomics += times
        elif opcode in ("LDL", "STL"):
            self.local += times
        elif opcode == "LDG":
            width = load_width(instruction.modifiers)
            self.global_loads[width] = self.global_loads.get(width, 0) + times

    def loads_text(self):
        return " ".join(f"{w}b:{self.global_loads[w]:g}" for w in sorted(self.global_loads)) or "-"


def load_width(modifiers: str) -> int:
    for width in (128, 64):
        if f".{width}" in modifiers:
            return width
    for name, width in ((".U8", 8), (".S8", 8), (".U16", 16), (".S16", 16)):
        if name in modifiers:
            return width
    return 32


def disassemble(cubin: bytes) -> list[Instruction]:
    """The SASS of the cubin's one kernel, via the cuobjdump that ships with Triton."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        listing = subprocess.run([str(tool), "-sass", file.name], capture_output=True, text=True, check=True).stdout
    instructions = []
    for match in INSTRUCTION.finditer(listing):
        address, _, opcode, modifiers, operands = match.groups()
        instructions.append(Instruction(int(address, 16), opcode, modifiers, operands.strip()))
    return instructions


def loops(instructions: list[Instruction]) -> list[tuple[int, int]]:
    """(first, last) addresses of every loop: a branch back to an earlier address (the trap's self-loop is not)."""
    found = set()
    for instruction in instructions:
        if instruction.opcode != "BRA":
            continue
        target = re.search(r"0x([0-9a-f]+)", instruction.operands)
        if target and int(target.group(1), 16) < instruction.address:
            found.add((int(target.group(1), 16), instruction.address))
    return sorted(found, key=lambda span: (span[0], -span[1]))


def trailing_padding(instructions: list[Instruction]) -> int:
    """How many instructions end the listing without ever running: after the last EXIT, the branch to itself
    that traps a fall-through and the NOPs that pad the code to its alignment."""
    count = 0
    for instruction in reversed(instructions):
        target = re.search(r"0x([0-9a-f]+)", instruction.operands)
        if instruction.opcode == "NOP" or (instruction.opcode == "BRA" and target
                                           and int(target.group(1), 16) == instruction.address):
            count += 1
        else:
            break
    return count if count < len(instructions) and instructions[-count - 1].opcode == "EXIT" else 0


def occupancy(registers: int, shared: int, warps: int, arch: int) -> float:
    """Resident warps per SM over the maximum, from registers, shared memory and the block limit."""
    limits = SM_LIMITS[arch]
    per_warp = math.ceil(registers * 32 / REGISTER_GRANULE) * REGISTER_GRANULE
    blocks = min(limits["blocks"], limits["warps"] // warps, limits["registers"] // (per_warp * warps),
                 limits["shared"] // (shared + SHARED_RESERVED_PER_BLOCK))
    return blocks * warps / limits["warps"]


# ---------------------------------------------------------------- what one launch of an LRAM kernel serves


@dataclass
class LookupSpec:
    """How many lookups a program serves, how often each SASS loop runs per program, the bytes per lookup."""
    lookups_per_program: int
    loop_trips: list  # per loop in address order; a loop past the list's end counts once
    bytes_per_lookup: float
    note: str = ""


def lookup_spec(project: str, kernel: str, constants: dict, pointers: dict) -> LookupSpec | None:
    """The spec of a launch from the project's kernel_cost_spec() in its ops/__init__.py (None where the project
    has none or it does not know the kernel)."""
    import importlib

    cost_spec = getattr(importlib.import_module(compile_kernels.ops_package(project)), "kernel_cost_spec", None)
    return cost_spec(kernel, constants, pointers, LookupSpec) if cost_spec else None


# ---------------------------------------------------------------- one row per launch


def cost_row(project, launch, arch):
    import triton

    compiled = compile_kernels.compile_to_cubin(launch, arch)
    cubin = compiled.asm["cubin"]
    usage = compile_kernels._resource_usage(cubin)
    instructions = disassemble(cubin)
    spans = loops(instructions)
    constants = launch["constants"]
    spec = lookup_spec(project, launch["kernel"], constants, launch["signature"])
    trips = list(spec.loop_trips) if spec else []
    trips += [1] * (len(spans) - len(trips))

    def times(instruction):
        return math.prod(t for (first, last), t in zip(spans, trips) if first <= instruction.address <= last)

    whole, executed = Mix(), Mix()
    padding = trailing_padding(instructions)
    for position, instruction in enumerate(instructions):
        whole.add(instruction)
        if position < len(instructions) - padding:
            executed.add(instruction, times(instruction))
    hot = Mix()
    if spans:  # the loop with the largest trip count, innermost on a tie
        hot_index = max(range(len(spans)), key=lambda i: (trips[i], spans[i][0]))
        first, last = spans[hot_index]
        for instruction in instructions:
            if first <= instruction.address <= last:
                hot.add(instruction)
    warps = compiled.metadata.num_warps
    row = {
        "project": project, "kernel": launch["kernel"], "triton": triton.__version__, "arch": f"sm_{arch}",
        "pointers": compile_kernels._pointer_dtypes(launch["signature"]),
        # the value table's dtype; "-" for a kernel without one or a launch that reads none (a None pointer)
        "values": launch["signature"].get("values_ptr", "-").lstrip("*").replace("constexpr", "-"),
        "constants": compile_kernels._constants_text(constants),
        "warps": warps, "regs": usage.get("reg", 0), "spill": usage.get("local", 0), "stack": usage.get("stack", 0),
        "spill_instructions": int(whole.local), "shared": compiled.metadata.shared,
        "occupancy": occupancy(usage.get("reg", 0), compiled.metadata.shared, warps, arch),
        "sass": int(whole.total), "loops": len(spans), "kernel_shfl": int(whole.shuffles),
        "kernel_bar": int(whole.barriers), "kernel_membar": int(whole.fences), "kernel_atomics": int(whole.atomics),
        "kernel_ldg": whole.loads_text(),
        "hot_loop": int(hot.total), "hot_shfl": int(hot.shuffles), "hot_bar": int(hot.barriers),
        "hot_membar": int(hot.fences), "hot_atomics": int(hot.atomics), "hot_ldg": hot.loads_text(),
    }
    if spec:
        per_lookup = executed.total * warps / spec.lookups_per_program
        row |= {"lookups_per_program": spec.lookups_per_program, "loop_trips": " ".join(f"{t:g}" for t in trips),
                "warp_instr_per_lookup": round(per_lookup), "bytes_per_lookup": round(spec.bytes_per_lookup),
                "instr_per_byte": round(per_lookup / spec.bytes_per_lookup, 3),
                "issue_ns_per_lookup": round(per_lookup / H100_WARP_INSTRUCTIONS_PER_S * 1e9, 3),
                "hbm_ns_per_lookup": round(spec.bytes_per_lookup / H100_HBM_BYTES_PER_S * 1e9, 3),
                "note": spec.note}
        issue, hbm = row["issue_ns_per_lookup"], row["hbm_ns_per_lookup"]
        row["bound"] = "HBM" if hbm >= issue else "instructions"
        row["margin"] = round(max(issue, hbm) / max(min(issue, hbm), 1e-9), 2)
    return row


COLUMNS = ["project", "kernel", "triton", "arch", "pointers", "values", "constants", "warps", "regs", "spill", "stack",
           "spill_instructions", "shared",
           "occupancy", "sass", "loops", "kernel_shfl", "kernel_bar", "kernel_membar", "kernel_atomics", "kernel_ldg",
           "hot_loop", "hot_shfl", "hot_bar", "hot_membar", "hot_atomics", "hot_ldg", "lookups_per_program",
           "loop_trips", "warp_instr_per_lookup", "bytes_per_lookup", "instr_per_byte", "issue_ns_per_lookup",
           "hbm_ns_per_lookup", "bound", "margin", "note"]


def print_table(rows):
    import triton

    print(f"Triton {triton.__version__}. values: dtype of the value table; regs: per thread; spill: bytes spilled "
          f"plus LDL/STL instructions; occ: theoretical occupancy; sass: instructions in the kernel; hot: "
          f"instructions in its hottest loop (shfl/bar/membar/atom of the kernel, then of the loop); instr/lookup: "
          f"warp-instructions executed per lookup; issue/HBM ns: per lookup on an H100 SXM if bound by "
          f"instruction issue / by HBM (spec-sheet model)")
    header = (f"{'kernel':<34}{'arch':<7}{'values':<7}{'warps':>5}{'regs':>5}{'spill':>6}{'occ':>5}{'sass':>6}"
              f"{'hot':>5}  {'shfl/bar/membar/atom':<22}{'instr/lookup':>13}{'bytes':>7}{'issue ns':>9}{'HBM ns':>8}"
              f"  constants")
    print(header)
    print("-" * len(header))
    for row in rows:
        mix = (f"{row['kernel_shfl']}/{row['kernel_bar']}/{row['kernel_membar']}/{row['kernel_atomics']} "
               f"({row['hot_shfl']}/{row['hot_bar']}/{row['hot_membar']}/{row['hot_atomics']})")
        per_lookup = row.get("warp_instr_per_lookup", "-")
        spill = row["spill"] + row["spill_instructions"]
        print(f"{row['project'] + '.' + row['kernel']:<34}{row['arch']:<7}{row['values']:<7}{row['warps']:>5}"
              f"{row['regs']:>5}{spill:>6}{row['occupancy']:>5.0%}{row['sass']:>6}{row['hot_loop']:>5}  "
              f"{mix:<22}{per_lookup:>13}{row.get('bytes_per_lookup', '-'):>7}"
              f"{row.get('issue_ns_per_lookup', '-'):>9}{row.get('hbm_ns_per_lookup', '-'):>8}  {row['constants']}")


def print_bounds(rows):
    """Per lookup: instruction time and memory time at H100 numbers, which bounds the kernel and by how much."""
    rows = [row for row in rows if "bound" in row]
    if not rows:
        return
    print(f"\nWhat bounds each memory-layer kernel on an H100 SXM (model: {H100_WARP_INSTRUCTIONS_PER_S / 1e12:.2f}e12 "
          f"warp-instructions/s, {H100_HBM_BYTES_PER_S / 1e12:.2f} TB/s; per lookup; margin = the larger time over "
          f"the smaller)")
    header = (f"{'kernel':<40}{'values':<7}{'instr/lookup':>13}{'bytes/lookup':>13}{'instr ns':>9}{'HBM ns':>8}"
              f"  {'bound':<13}{'margin':>6}  constants")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(f"{row['project'] + '.' + row['kernel']:<40}{row['values']:<7}{row['warp_instr_per_lookup']:>13}"
              f"{row['bytes_per_lookup']:>13}{row['issue_ns_per_lookup']:>9}{row['hbm_ns_per_lookup']:>8}  "
              f"{row['bound']:<13}{row['margin']:>6}  {row['constants']}")
    notes = sorted({f"{row['project']}.{row['kernel']}: {row['note']}" for row in rows if row.get("note")})
    if notes:
        print("what a lookup is and what the counts assume:\n  " + "\n  ".join(notes))


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--project", choices=compile_kernels.PROJECTS, action="append",
                        help="project whose kernels to cost; repeat for several (default: lram_gpt and pkm_gpt)")
    parser.add_argument("--arch", type=int, choices=sorted(SM_LIMITS), default=90,
                        help="compute capability as one number (default 90: H100/H200)")
    parser.add_argument("--csv", type=Path, help="also write the table to this CSV file")
    parser.add_argument("--append", action="store_true",
                        help="add the rows to the CSV file (e.g. another Triton version's) instead of replacing it")
    args = parser.parse_args(argv)

    compile_kernels.prepare_compiling()
    rows = []
    for project in args.project or ["lram_gpt", "pkm_gpt"]:
        print(f"{project}: recording its kernel launches under the interpreter", file=sys.stderr, flush=True)
        launches = compile_kernels.recorded_launches(project)
        print(f"{project}: compiling and disassembling {len(launches)} launches for sm_{args.arch}", file=sys.stderr,
              flush=True)
        rows += [cost_row(project, launch, args.arch) for launch in launches]
    print_table(rows)
    print_bounds(rows)
    if args.csv:
        append = args.append and args.csv.exists()
        with open(args.csv, "a" if append else "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=COLUMNS, extrasaction="ignore")
            if not append:
                writer.writeheader()
            writer.writerows(rows)
    return rows


if __name__ == "__main__":
    main()
