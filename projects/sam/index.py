"""The nearest-neighbour index SAM's read searches (thesis 3.2.7): the K words most similar to a query by cosine.

"exact" scans every word (ops/topk: PyTorch on CPU, the Triton kernel on CUDA): O(N) per query. "faiss" keeps a
FAISS inverted-file index (IVF, inner product on unit vectors, a flat coarse quantizer) per stream beside the
memory, in sync with every write (the written words are removed and added again), searched in about
O(nprobe * N / nlist + nlist) instead of O(N): the thesis's approximate index, with FAISS in place of FLANN's
k-d trees. As in the thesis, no gradient passes through an index, it holds unit-norm copies of the written words
only (an all-zero word is never returned while K written ones are found), and it is rebuilt from the memory
(retrained on its words) after every N insertions, so that it does not become unbalanced. FAISS is an optional
extra: `pip install faiss-cpu` (or `pip install -e ".[sam]"`).
"""
import math

import numpy as np
import torch

from projects.sam.ops.topk import cosine_topk

INDEXES = ("exact", "faiss")


def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def _faiss():
    try:
        import faiss
    except ImportError as error:
        raise ImportError("index='faiss' needs FAISS: pip install faiss-cpu (or pip install -e '.[sam]')") from error
    return faiss


def _unit(rows: np.ndarray) -> np.ndarray:
    """Rows (n, W) scaled to norm 1 (all-zero rows stay zero)."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms > 0, norms, 1.0)


class FaissIndex:
    """One IVF index per stream over the written words of a (B, N, W) CPU memory.

    nlist: inverted lists (default round(sqrt(N))); nprobe: lists searched per query (nprobe = nlist is exact);
    threads: FAISS's OpenMP threads (1: a step's searches are too small to share)."""

    def __init__(self, memory: torch.Tensor, nlist: int | None = None, nprobe: int = 4, seed: int = 0,
                 threads: int = 1):
        if memory.device.type != "cpu":
            raise ValueError("the FAISS index needs the memory on the CPU")
        self.faiss = _faiss()
        self.faiss.omp_set_num_threads(threads)
        self.words, self.width = memory.shape[1], memory.shape[2]
        self.nlist = nlist or max(1, round(math.sqrt(self.words)))
        self.nprobe = min(nprobe, self.nlist)
        self.seed = seed
        self.indexes = [self._build(memory[b]) for b in range(memory.shape[0])]
        self.insertions = [0] * memory.shape[0]

    def _build(self, words: torch.Tensor):
        """A fresh index trained on the stream's written words (random unit vectors while there are fewer written
        words than lists)."""
        faiss = self.faiss
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(self.width), self.width, self.nlist, faiss.METRIC_INNER_PRODUCT)
        # FAISS asks for 39 points per list, more than N words give for N < 1,600 (nlist = sqrt(N)); fewer written
        # words train lists that follow them, where random padding would spend lists on places no word is
        index.cp.min_points_per_centroid = 1
        rows = words.detach().numpy()
        written = np.flatnonzero(np.abs(rows).sum(1) > 0)
        wanted = 40 * self.nlist
        rng = np.random.default_rng(self.seed)
        if len(written) >= wanted:
            train = rows[rng.choice(written, wanted, replace=False)]
        elif len(written) >= self.nlist:
            train = rows[written]
        else:
            train = np.concatenate([rows[written], rng.standard_normal((self.nlist - len(written), self.width))])
        index.train(_unit(train.astype(np.float32)))
        index.set_direct_map_type(faiss.DirectMap.Hashtable)  # removal by id in O(1)
        index.nprobe = self.nprobe
        if len(written):
            index.add_with_ids(_unit(rows[written]).astype(np.float32), written.astype(np.int64))
        return index

    def update(self, memory: torch.Tensor, written: list[list[int]]) -> None:
        """Re-index the words each stream wrote (after the write changed them in `memory`)."""
        for b, words in enumerate(written):
            if not words:
                continue
            ids = np.unique(np.asarray(words, dtype=np.int64))
            index = self.indexes[b]
            index.remove_ids(ids)
            rows = memory[b, torch.from_numpy(ids)].detach().numpy()
            nonzero = np.abs(rows).sum(1) > 0
            if nonzero.any():
                index.add_with_ids(_unit(rows[nonzero]).astype(np.float32), ids[nonzero])
            self.insertions[b] += len(ids)
            if self.insertions[b] >= self.words:
                self.indexes[b], self.insertions[b] = self._build(memory[b]), 0

    def search(self, query: torch.Tensor, k: int) -> torch.Tensor:
        """(B, H, k) int64 word indices nearest each query (B, H, W); where the index returns fewer than k, the
        first words not among the results fill in (their weights are computed from the memory like any other)."""
        B, H, _ = query.shape
        queries = _unit(query.detach().float().cpu().numpy().reshape(B * H, -1)).astype(np.float32).reshape(B, H, -1)
        out = np.empty((B, H, k), dtype=np.int64)
        for b, index in enumerate(self.indexes):
            _, ids = index.search(np.ascontiguousarray(queries[b]), k)
            for h in range(H):
                row = ids[h]
                if (row < 0).any():
                    found = [int(i) for i in row if i >= 0]
                    found += [i for i in range(2 * k) if i not in found][:k - len(found)]
                    row = np.asarray(found)
                out[b, h] = row
        return torch.from_numpy(out).to(query.device)


def search(query: torch.Tensor, memory: torch.Tensor, k: int, faiss_index: FaissIndex | None = None,
           impl: str | None = None) -> torch.Tensor:
    """(B, H, k) word indices of the k words nearest each query: through the FAISS index when given, else exact."""
    if faiss_index is not None:
        return faiss_index.search(query, k)
    return cosine_topk(query, memory, k, impl)[1]
