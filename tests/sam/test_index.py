"""The FAISS index (index.py) against exact search: exhaustive (nprobe = nlist), it must return the exact K nearest
words after any number of writes, index rebuilds included, and a SAM core searching it must compute what the
same core computes with exact search. Skipped without FAISS (pip install faiss-cpu)."""
import pytest
import torch

from projects.sam.configs import MemoryConfig
from projects.sam.core import MemoryCore
from projects.sam.ops.topk import cosine_topk

faiss = pytest.importorskip("faiss")
from projects.sam.index import FaissIndex  # noqa: E402


def test_exhaustive_faiss_search_equals_exact_search_through_writes_and_rebuilds():
    g = torch.Generator().manual_seed(0)
    B, N, W, K = 2, 40, 6, 4
    memory = torch.randn(B, N, W, generator=g)
    memory[:, 10:25] = 0.0  # never written: not in the index
    index = FaissIndex(memory, nprobe=1000)
    assert index.nprobe == index.nlist  # every list searched: exact
    for step in range(30):  # 30 x 3 insertions per stream: rebuilt twice (every N = 40)
        written = [torch.randint(N, (3,), generator=g).tolist() for _ in range(B)]
        for b, words in enumerate(written):
            memory[b, words] = torch.randn(len(words), W, generator=g)
            if step % 7 == 0:
                memory[b, words[0]] = 0.0  # an erased word leaves the index
        index.update(memory, written)
        query = torch.randn(B, 3, W, generator=g)
        assert torch.equal(index.search(query, K), cosine_topk(query, memory, K, "naive")[1])


def test_sam_core_with_an_exhaustive_faiss_index_computes_what_it_computes_with_exact_search():
    torch.manual_seed(0)
    exact = MemoryCore(MemoryConfig(kind="sam", hidden=16, heads=2, word_size=8, words=64, k=3), 5, 4)
    approx = MemoryCore(MemoryConfig(kind="sam", hidden=16, heads=2, word_size=8, words=64, k=3, index="faiss",
                                     nlist=4, nprobe=4), 5, 4)
    approx.load_state_dict(exact.state_dict())
    memory = torch.randn(2, 64, 8)
    x = torch.randn(2, 25, 5)
    outputs, grads = [], []
    for core in (exact, approx):
        state = core.initial_state(2, "cpu")
        state["memory"] = memory.clone()  # words everywhere: no ties among never-written words
        y, state = core(x, state)
        y.square().sum().backward()  # before the next forward changes the memory the rollback needs
        y2, _ = core(x, state)  # a second segment: the index is found again and kept in sync
        y2.square().sum().backward()
        outputs.append(torch.cat([y, y2], 1))
        grads.append([p.grad for p in core.parameters()])
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=1e-5)
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_the_recall_benchmark_counts_what_an_index_finds():
    """bench_index.py: the exact scan and an exhaustive IVF (nprobe = nlist) find every nearest word through the
    overwrites (recall 1); an IVF probing 1 of 8 lists on random words finds fewer; an HNSW graph's stale copies
    of overwritten words are never returned."""
    from projects.sam import bench_index

    for name, recall in (("exact", 1.0), ("ivf8x8", 1.0)):
        assert bench_index.measure(faiss, name, 8, 16, 4, 4, 30)["recall_at_k"] == recall
    assert bench_index.measure(faiss, "ivf8x1", 8, 16, 4, 4, 30)["recall_at_k"] < 0.9
    g = torch.Generator().manual_seed(0)
    words = bench_index.unit(torch.randn(64, 16, generator=g).numpy())
    graph = bench_index.build(faiss, "hnsw8x64", words)
    new = bench_index.unit(torch.randn(1, 16, generator=g).numpy())
    graph.write(torch.tensor([5]).numpy(), new)
    old_nearest = graph.search(words[5:6], 1)[0, 0]  # the old word 5's vector: its stale copy (cosine 1) skipped
    others = words @ words[5]
    others[5] = -2.0
    assert old_nearest == others.argmax() and float((new @ words[5])[0]) < others.max()  # not 5: another word
    assert graph.search(new, 1)[0, 0] == 5  # the new word 5 is found as itself
    with pytest.raises(SystemExit, match="ivf<nlist>x<nprobe>"):
        bench_index.build(faiss, "flat", words)


def test_the_recall_benchmark_reads_a_trained_models_memory(tmp_path, default_corpus_root):
    """--from_run: the words a SAM language model wrote while reading the valid split, and its read queries."""
    import json

    from projects.sam import bench_index
    from projects.sam.configs import get
    from projects.sam.model import Model

    cfg = get("cpu", vocab_size=2048, d_model=16, hidden=16, words=64, seq_len=16)
    torch.manual_seed(0)
    torch.save({"model": Model(cfg).state_dict()}, tmp_path / "checkpoint.pt")
    (tmp_path / "config.json").write_text(json.dumps({"model": vars(cfg), "train": {"data_root": None}}))
    words, queries = bench_index.trained_words(str(tmp_path), 5, 64, 10, data_root=default_corpus_root)
    assert words.shape == (32, cfg.word_size)  # 64 tokens, 2 heads: every one of 32 words written
    assert queries.shape == (10 * cfg.heads, cfg.word_size)
    assert abs(float((words ** 2).sum(1).mean()) - 1) < 1e-5
    assert bench_index.measure_static(faiss, "exact", words, queries, 4)["recall_at_k"] == 1.0
    assert bench_index.measure_static(faiss, "ivf4x4", words, queries, 4)["recall_at_k"] == 1.0  # exhaustive


def test_lists_trained_on_fewer_words_than_faiss_asks_for_follow_the_words():
    """1,024 words in 32 tight clusters train 32 lists (FAISS asks for 39 x 32 = 1,248 points): every list's centroid
    lies near a cluster. Padding the training set with random vectors put some centroids where no word is (the
    farthest at cosine 0.25 from every cluster)."""
    import numpy as np

    g = torch.Generator().manual_seed(0)
    centres = torch.nn.functional.normalize(torch.randn(32, 32, generator=g), dim=1)
    words = centres.repeat_interleave(32, 0) + 0.05 * torch.randn(1024, 32, generator=g)
    index = FaissIndex(words[None], nprobe=1)
    assert index.nlist == 32
    quantizer = index.indexes[0].quantizer
    centroids = np.stack([quantizer.reconstruct(i) for i in range(index.nlist)])
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    # k-means may leave a centroid between two clusters (0.76 here), never far from all of them
    assert (centroids @ centres.numpy().T).max(1).min() > 0.6
