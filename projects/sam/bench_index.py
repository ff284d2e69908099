"""Recall@K against time of SAM's approximate indexes (thesis 3.2.7) on random words: what fraction of the exact
top-K by cosine each index returns, and what one stream's step costs it (H queries, then H words overwritten, as
SAM reads and writes), against N.

Indexes: index.py's FAISS IVF index (`ivf<nlist>x<nprobe>`, nlist 0: round(sqrt(N)), rebuilt after N
insertions), and FAISS HNSW (`hnsw<M>x<efSearch>`), which cannot remove a vector: an overwritten word
is added again under a new id and its stale copy skipped when found (searching a few more than K), as an index
supporting SAM's overwrites would. One thread, one stream; the exact scan's time beside.

    python projects/sam/bench_index.py --words 10 16 20 --csv index_recall.csv
"""
import argparse
import csv
import math
import sys
import time

import numpy as np

from languini.flags import Parser

DEFAULT_INDEXES = ["ivf0x4", "ivf0x16", "ivf0x64", "ivf0x256", "hnsw16x32", "hnsw16x64", "hnsw32x128"]


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


class Hnsw:
    """HNSW over the words with overwrites: a word's current copy is the id last added for it."""

    def __init__(self, faiss, words: np.ndarray, m: int, ef: int):
        self.index = faiss.IndexHNSWFlat(words.shape[1], m, faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = 40
        self.index.hnsw.efSearch = ef
        self.index.add(words)
        self.word_of = list(range(len(words)))  # FAISS id -> word
        self.current = np.arange(len(words))  # word -> its live FAISS id

    def search(self, queries: np.ndarray, k: int) -> np.ndarray:
        _, ids = self.index.search(queries, 2 * k)  # stale copies are skipped
        out = np.empty((len(queries), k), dtype=np.int64)
        for row, found in enumerate(ids):
            live = [self.word_of[i] for i in found if i >= 0 and self.current[self.word_of[i]] == i]
            out[row] = (live + [-1] * k)[:k]
        return out

    def write(self, word_ids: np.ndarray, rows: np.ndarray) -> None:
        self.current[word_ids] = np.arange(len(self.word_of), len(self.word_of) + len(word_ids))
        self.word_of.extend(int(w) for w in word_ids)
        self.index.add(rows)


class Ivf:
    """index.py's FaissIndex (the IVF index SAM reads through) over one stream's words."""

    def __init__(self, words: np.ndarray, nlist: int, nprobe: int):
        import torch

        from projects.sam.index import FaissIndex

        self.torch, self.words = torch, torch.from_numpy(words).unsqueeze(0)
        self.index = FaissIndex(self.words, nlist, nprobe)

    def search(self, queries: np.ndarray, k: int) -> np.ndarray:
        return self.index.search(self.torch.from_numpy(queries).unsqueeze(0), k)[0].numpy()

    def write(self, word_ids: np.ndarray, rows: np.ndarray) -> None:
        self.words[0, self.torch.from_numpy(word_ids)] = self.torch.from_numpy(rows)
        self.index.update(self.words, [word_ids.tolist()])


def build(faiss, name: str, words: np.ndarray):
    """An index named ivf<nlist>x<nprobe> or hnsw<M>x<efSearch> over the words."""
    kind = "ivf" if name.startswith("ivf") else "hnsw"
    if not name.startswith(("ivf", "hnsw")) or name[len(kind):].count("x") != 1:
        raise SystemExit(f"an index is exact, ivf<nlist>x<nprobe> or hnsw<M>x<efSearch>, not {name!r}")
    a, b = (int(v) for v in name[len(kind):].split("x"))
    if kind == "ivf":
        nlist = a or max(1, round(math.sqrt(len(words))))
        return Ivf(words, nlist, min(b, nlist))
    return Hnsw(faiss, words, a, b)


def exact_top_k(queries: np.ndarray, words: np.ndarray, k: int) -> np.ndarray:
    return np.argpartition(-(queries @ words.T), k, axis=1)[:, :k]


def measure(faiss, name: str, log2_words: int, width: int, heads: int, k: int, steps: int, seed: int = 0) -> dict:
    """Recall@k over `steps` steps of one stream (heads queries, then heads words overwritten), against the exact
    top-k of the memory each search saw; the median step time (search and index update)."""
    rng = np.random.default_rng(seed)
    n = 2 ** log2_words
    words = unit(rng.standard_normal((n, width)))
    started = time.perf_counter()
    index = None if name == "exact" else build(faiss, name, words)
    build_seconds = time.perf_counter() - started
    hits, step_seconds = 0, []
    for _ in range(steps):
        queries = unit(rng.standard_normal((heads, width)))
        exact = exact_top_k(queries, words, k)
        started = time.perf_counter()
        found = exact_top_k(queries, words, k) if index is None else index.search(queries, k)
        written = rng.choice(n, heads, replace=False)  # SAM overwrites a word per head
        words[written] = unit(rng.standard_normal((heads, width)))
        if index is not None:
            index.write(written, words[written])
        step_seconds.append(time.perf_counter() - started)
        hits += sum(len(set(f.tolist()) & set(e.tolist())) for f, e in zip(found, exact))
    return {"index": name, "words": f"2^{log2_words}", "recall_at_k": hits / (steps * heads * k),
            "ms_per_step": 1000 * float(np.median(step_seconds)), "build_seconds": round(build_seconds, 2)}


def trained_words(run: str, log2_words: int, tokens: int, queries: int, split: str = "valid", data_root=None):
    """Run a trained SAM language model (a run folder of projects/sam/train.py) over the first `tokens` tokens of
    `split`, one stream, with 2^log2_words words (exact search): its memory at the end, unit rows of the written
    words (n, W), and the read queries of its last `queries` steps (heads each), unit rows."""
    import json
    from pathlib import Path

    import torch

    from languini.books import BooksDataset, eval_batches
    from projects.sam import core
    from projects.sam.configs import ModelConfig
    from projects.sam.model import Model

    saved = json.loads((Path(run) / "config.json").read_text())
    cfg = ModelConfig(**{**saved["model"], "words": 2 ** log2_words, "index": "exact"})
    model = Model(cfg).eval()
    model.load_state_dict(torch.load(Path(run) / "checkpoint.pt", weights_only=False)["model"])
    dataset = BooksDataset(data_root or saved["train"].get("data_root") or "data", cfg.vocab_size)
    asked, search = [], core.search

    def recording(query, memory, k, *rest):
        asked.append(query[0].detach().clone())
        del asked[:-queries]
        return search(query, memory, k, *rest)

    core.search, state, read = recording, None, 0
    try:
        with torch.no_grad():
            for x, _, _ in eval_batches(dataset.books(split), cfg.vocab_size, 1, cfg.seq_len):
                _, state = model(x, state)
                read += x.numel()
                if read >= tokens:
                    break
    finally:
        core.search = search
    memory = state["memory"][0]
    written = memory[memory.abs().sum(1) > 0].numpy()
    return unit(written), unit(torch.cat(asked).numpy())


def measure_static(faiss, name: str, words: np.ndarray, queries: np.ndarray, k: int) -> dict:
    """Recall@k of the queries over fixed words, the median time of a search of one step's queries, and how far
    below the exact K-th nearest word's cosine the K-th found word's lies (the mean over queries)."""
    index = None if name == "exact" else build(faiss, name, words)
    exact = exact_top_k(queries, words, k)
    found, seconds = [], []
    heads = 4
    for start in range(0, len(queries), heads):
        began = time.perf_counter()
        batch = queries[start:start + heads]
        found.append(exact_top_k(batch, words, k) if index is None else index.search(batch, k))
        seconds.append(time.perf_counter() - began)
    found = np.concatenate(found)
    hits = sum(len(set(f.tolist()) & set(e.tolist())) for f, e in zip(found, exact))
    # near-duplicate words make recall by identity harsh: also how close the found words are, by cosine
    similarity = np.take_along_axis(queries @ words.T, np.concatenate([found, exact], 1), 1)
    gap = float(np.mean(similarity[:, k:].min(1) - similarity[:, :k].min(1)))
    return {"index": name, "words": f"{len(words)} trained", "recall_at_k": hits / (len(queries) * k),
            "ms_per_step": 1000 * float(np.median(seconds)), "kth_cosine_gap": gap}


def main(argv=None):
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--words", type=int, nargs="+", default=[10, 16, 20], help="log2 N")
    parser.add_argument("--indexes", nargs="+", default=["exact", *DEFAULT_INDEXES])
    parser.add_argument("--width", type=int, default=32, help="W (A.2)")
    parser.add_argument("--heads", type=int, default=4, help="queries and written words per step (A.1: 4 heads)")
    parser.add_argument("--k", type=int, default=4, help="K (A.1)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--csv", default=None)
    parser.add_argument("--from_run", default=None,
                        help="a trained SAM language model's run folder: measure on the words it writes and the "
                             "queries it reads with (over --tokens of the valid split), not on random words")
    parser.add_argument("--tokens", type=int, default=20_000, help="with --from_run: tokens the model reads")
    parser.add_argument("--data_root", default=None, help="with --from_run: the data (default: the run's)")
    args = parser.parse_args(argv)
    import faiss

    faiss.omp_set_num_threads(1)
    rows = []
    for log2_words in args.words if args.from_run else ():
        words, queries = trained_words(args.from_run, log2_words, args.tokens, 1000, data_root=args.data_root)
        for name in args.indexes:
            row = measure_static(faiss, name, words, queries, args.k)
            rows.append(row)
            print(f"{row['words']:>14} {name:<12} recall@{args.k} {row['recall_at_k']:.3f}  "
                  f"{row['ms_per_step']:8.3f} ms per search of 4 queries; the K-th found word's cosine "
                  f"{row['kth_cosine_gap']:.4f} below the exact K-th's", flush=True)
    for log2_words in args.words if not args.from_run else ():
        for name in args.indexes:
            row = measure(faiss, name, log2_words, args.width, args.heads, args.k, args.steps)
            rows.append(row)
            print(f"{row['words']:>5} {name:<12} recall@{args.k} {row['recall_at_k']:.3f}  "
                  f"{row['ms_per_step']:8.3f} ms/step  (built in {row['build_seconds']:.1f} s)", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
