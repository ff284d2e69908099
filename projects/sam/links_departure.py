"""How far the Sparse DNC's link reads are from eq. 3.19-3.20 as printed, once K_L binds.

links.follow reads f = L a through P's rows (P^T a) and b = L^T a through N's rows (N^T a), O(K K_L) per head;
eq. 3.19-3.20 write f = N a and b = P a, which need N's and P's columns, O(N) without an index of columns. Until
K_L binds P = N^T and the two agree. This runs an SDNC core (Appendix A's sizes unless given; untrained, seeded)
one step at a time on a task's episodes, its writes also applied to the DNC's dense L (eq. 3.11), and at every
step compares, for every stream and head, the weights one link away from the previous read weights as the step
computes them, as eq. 3.19-3.20 print them, and through L (eq. 3.13-3.14), on the links after the step's write:
relative L1 distances |x - y|_1 / |y|_1, their mean and largest over steps, streams and heads, for each K_L.

    python projects/sam/links_departure.py --task copy --words 128 --k_links 2 4 8 --episodes 4
"""
import argparse
import sys
from dataclasses import replace

import torch

from languini.flags import Parser
from projects.sam import links, tasks
from projects.sam.configs import MemoryConfig
from projects.sam.core import MemoryCore


def dense(state: dict, name: str) -> torch.Tensor:
    """The sparse matrix `name` ("link": N, "back": P) of every stream as a dense (B, N, N) float64 tensor."""
    batch, rows = state["link_cols"].shape[:2]
    cols, vals = links.entries(state, name, torch.arange(rows).expand(batch, rows))
    return torch.zeros(batch, rows, rows, dtype=torch.float64).scatter_add_(2, cols, vals)[:, :-1, :-1]


def relative_l1(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want|_1 / |want|_1 over the last dimension, where want is not 0: a flat tensor."""
    norm = want.abs().sum(-1)
    return ((got - want).abs().sum(-1) / norm)[norm > 0]


def compare(state: dict, dense_link: torch.Tensor, words: torch.Tensor, weights: torch.Tensor) -> dict:
    """For read weights `weights` on `words` (B, H, K): per direction, the weights one link away as links.follow
    computes them, as eq. 3.19-3.20 print them (N a forwards, P a backwards) and through the DNC's dense L
    (`dense_link`, (B, N, N)), each (B, H, N) float64."""
    batch, heads, _ = words.shape
    size = state["link_cols"].shape[1] - 1
    a = torch.zeros(batch, heads, size + 1, dtype=torch.float64).scatter_add_(2, words, weights.double())[..., :-1]
    out = {}
    for direction, printed in (("forward", "link"), ("backward", "back")):
        cand, vals = links.follow(state, direction, words, weights)
        follow = torch.zeros(batch, heads, size + 1, dtype=torch.float64).scatter_add_(2, cand, vals.double())
        out[direction] = {"follow": follow[..., :-1],
                          "printed": torch.einsum("bij,bhj->bhi", dense(state, printed), a),
                          "dense": links.dense_follow(dense_link, direction, a)}
    return out


@torch.no_grad()
def measure(task: str, k_links: int, episodes: int, seed: int = 0, batch: int = 8, level: int | None = None,
            **memory) -> dict:
    """Runs an SDNC core with `k_links` one step at a time over `episodes` episodes of `task` at `level` (default
    the task's largest), its writes also applied to a dense L (eq. 3.11); returns per direction the relative L1
    distances (mean, largest, count) of links.follow's weights from the printed ones, and of each from L a."""
    torch.manual_seed(seed)
    spec = tasks.spec(task)
    core = MemoryCore(replace(MemoryConfig(), kind="sdnc", k_links=k_links, **memory), spec.inputs, spec.outputs)
    size = core.cfg.words
    generator = torch.Generator().manual_seed(seed + 1)
    pairs = {"follow-printed": ("follow", "printed"), "follow-dense": ("follow", "dense"),
             "printed-dense": ("printed", "dense")}
    found = {(direction, pair): [] for direction in ("forward", "backward") for pair in pairs}
    dense_links = {}
    sparse_update = links.update_links

    def update_both(state, words, weights):  # the core's writes, on the sparse links and on the dense L
        sparse_update(state, words, weights)
        w = torch.zeros(batch, size, dtype=torch.float64).scatter_add_(1, words, weights.double())
        dense_links["L"], dense_links["p"] = links.dense_link_update(dense_links["L"], dense_links["p"], w)

    links.update_links = update_both
    try:
        for _ in range(episodes):
            x, _, _ = tasks.episode(task, batch, level or spec.levels[1], generator)
            dense_links.update(L=torch.zeros(batch, size, size, dtype=torch.float64),
                               p=torch.zeros(batch, size, dtype=torch.float64))
            state = None
            for t in range(x.shape[1]):
                previous = state
                _, state = core(x[:, t:t + 1], state)
                if previous is None:
                    continue
                # the step followed the links, after its write, from the previous step's read weights
                reads = compare(state, dense_links["L"], previous["read_words"], previous["read_weights"])
                for (direction, pair), values in found.items():
                    got, want = pairs[pair]
                    values.append(relative_l1(reads[direction][got], reads[direction][want]))
    finally:
        links.update_links = sparse_update
    result = {}
    for (direction, pair), values in found.items():
        values = torch.cat(values)
        result[direction, pair] = {"mean": float(values.mean()), "max": float(values.max()), "count": values.numel()}
    return result


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=tasks.TASKS, default="copy")
    parser.add_argument("--words", type=int, default=128, help="memory words N")
    parser.add_argument("--k_links", type=int, nargs="+", default=[8], help="K_L values to measure")
    parser.add_argument("--episodes", type=int, default=4, help="episodes (minibatches of 8) per K_L")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{args.task}, N = {args.words}, untrained SDNC, {args.episodes} minibatches of 8: relative L1 distance "
          f"|x - y|_1 / |y|_1 per stream and head, mean (largest)")
    print(f"{'K_L':>4s}  {'direction':10s}{'follow vs printed':>20s}{'follow vs L a':>18s}{'printed vs L a':>18s}"
          f"{'reads':>8s}")
    for k_links in args.k_links:
        r = measure(args.task, k_links, args.episodes, args.seed, words=args.words)
        for direction in ("forward", "backward"):
            cells = [f"{r[direction, pair]['mean']:.3f} ({r[direction, pair]['max']:.2f})"
                     for pair in ("follow-printed", "follow-dense", "printed-dense")]
            print(f"{k_links:4d}  {direction:10s}{cells[0]:>20s}{cells[1]:>18s}{cells[2]:>18s}"
                  f"{r[direction, 'follow-printed']['count']:8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
