"""projects/compressive/recall.py: the recall task's streams against a hand-worked layout, and its distance bands
against a brute-force simulation of which positions each model's memories hold (Algorithm 5's FIFOs replayed on
position numbers), not against the script's own range arithmetic."""
import pytest
import torch

from projects.compressive import recall


# T = 4, n_m = 4, n_cm = 4, c = 2, one layer. By hand: a Transformer-XL query at segment index i (0..3) reads
# i + 8 back (8 = n_m + n_cm memories), at most 11; a Compressive one i + 4 + 2 x 4 = i + 12, at least 12, at
# most 15. Bands: near 1..4, far 12..12 (past 11, up to 12), beyond 16..16 (past 15, as wide as far).
# Episode: the farthest query (16) after the payload's last copy at 1 is at 17, so 18 positions (a multiple of c,
# and more than 15: the previous payload is out of reach). Queries at 1 + d: 2, 3, 4, 5 (near), 13, 17.
TINY = dict(seq_len=4, mem_len=4, cmem_len=4, compression_rate=2, n_layers=1, n_payloads=3, n_fillers=2, queries=50)
HAND_BANDS = {"near": (1, 4), "far": (12, 12), "beyond": (16, 16)}
HAND_QUERIES = {2: 1, 3: 2, 4: 3, 5: 4, 13: 12, 17: 16}  # episode offset -> distance to the payload's last copy


def test_bands_and_episode_by_hand():
    task = recall.RecallTask(**TINY)
    assert task.bands() == HAND_BANDS
    assert task.episode_len == 18
    assert (task.query_token, task.vocab_size) == (5, 6)  # fillers 0, 1; payloads 2, 3, 4; query 5
    assert [task.coverage(b, False) for b in HAND_BANDS] == ["all", "none", "none"]  # 4 <= 8; 12 > 11; 16 > 11
    assert [task.coverage(b, True) for b in HAND_BANDS] == ["all", "all", "none"]  # 4, 12 <= 12; 16 > 15


def test_no_far_band_is_refused():
    # c = 2 with two layers: the Transformer-XL's 3 + 2 x 8 = 19 is past the Compressive's 4 + 2 x 4 = 12
    with pytest.raises(ValueError, match="no distance"):
        recall.RecallTask(**{**TINY, "n_layers": 2})
    with pytest.raises(ValueError, match="multiples of c"):
        recall.RecallTask(**{**TINY, "seq_len": 5})


def test_stream_layout_by_hand():
    task = recall.RecallTask(**TINY)
    tokens, targets, distances = recall.make_stream(task, 3 * 18, torch.Generator().manual_seed(1), phase=0)
    for e in range(3):
        episode = slice(18 * e, 18 * (e + 1))
        tok, tgt, dist = tokens[episode].tolist(), targets[episode].tolist(), distances[episode].tolist()
        payload = tok[0]
        assert 2 <= payload <= 4 and tok[1] == payload
        for offset in range(2, 18):
            if offset in HAND_QUERIES:
                assert (tok[offset], tgt[offset], dist[offset]) == (5, payload, HAND_QUERIES[offset])
            else:
                assert tok[offset] in (0, 1) and tgt[offset] == dist[offset] == -1
        assert tgt[:2] == dist[:2] == [-1, -1]
    bands = recall.band_of(task, distances)
    scored = (tokens == task.query_token).nonzero().flatten().tolist()
    assert (bands >= 0).nonzero().flatten().tolist() == scored  # only queries are scored
    assert [bands[18 + offset].item() for offset in sorted(HAND_QUERIES)] == [0, 0, 0, 0, 1, 2]


def test_phase_drops_queries_without_payload():
    task = recall.RecallTask(**TINY)
    tokens, targets, distances = recall.make_stream(task, 26, torch.Generator().manual_seed(2), phase=10)
    # stream position 0 is episode offset 10: the cut episode's queries at offsets 13, 17 (positions 3, 7) go;
    # the next episode fills positions 8 .. 25
    assert (targets[:8] == -1).all() and (tokens[:8] < 2).all()
    assert tokens[8] == tokens[9] and 2 <= tokens[8] <= 4  # the next episode starts at 18 - 10 = 8
    assert [p for p, d in enumerate(distances.tolist()) if d > 0] == [8 + offset for offset in sorted(HAND_QUERIES)]
    with pytest.raises(ValueError, match="phase"):
        recall.make_stream(task, 40, torch.Generator(), phase=3)


def visible_positions(n: int, T: int, n_m: int, n_cm: int, c: int):
    """Per position q, the positions one layer's attention reads at q (Algorithm 5 replayed on position numbers:
    the segment up to q, the FIFO of the last n_m inputs, the FIFO of the newest n_cm compressed c-tuples of what
    leaves it), and per position the compressed tuple holding it when it is read through the compressed memory."""
    visible, slots, mem, cmem = [], [], [], []
    for s in range(0, n, T):
        segment = list(range(s, s + T))
        for q in segment:
            held = {p: slot for slot in cmem for p in slot}
            visible.append({p for p in segment if p <= q} | set(mem) | set(held))
            slots.append(held)
        pushed = mem + segment
        old, mem = pushed[:max(0, len(pushed) - n_m)], pushed[max(0, len(pushed) - n_m):]
        if n_cm:
            cmem = (cmem + [tuple(old[k:k + c]) for k in range(0, len(old) - len(old) % c, c)])[-n_cm:]
    return visible, slots


def reach(visible, layers: int):
    """Per position, the positions its output after `layers` layers depends on (position q's layer-k input at
    a position t depends on what t's layer k-1 read)."""
    deps = [{q} for q in range(len(visible))]
    for _ in range(layers):
        deps = [set().union(*(deps[t] for t in visible[q])) for q in range(len(visible))]
    return deps


@pytest.mark.parametrize("sizes, hand_farthest, hand_bands", [
    (TINY, (11, 15), HAND_BANDS),
    # two layers need c > 2 for a far band: Transformer-XL 3 + 2 x 8 = 19 (a hop from index i reaches i + 8 and
    # lands at index i - (i + 8) = 0 mod 4), Compressive 3 + 2 x (4 + 4 x 4) = 43; far band 20..20
    ({**TINY, "compression_rate": 4, "n_layers": 2}, (19, 43),
     {"near": (1, 4), "far": (20, 20), "beyond": (44, 44)}),
])
def test_bands_against_simulated_memories(sizes, hand_farthest, hand_bands):
    task = recall.RecallTask(**sizes)
    T, n_m, n_cm, c, layers = (sizes[k] for k in ("seq_len", "mem_len", "cmem_len", "compression_rate", "n_layers"))
    n = 12 * task.episode_len
    txl_visible, _ = visible_positions(n, T, n_m + n_cm, 0, c)
    comp_visible, comp_slots = visible_positions(n, T, n_m, n_cm, c)
    txl_deps, comp_deps = reach(txl_visible, layers), reach(comp_visible, layers)
    warm = 3 * task.episode_len  # memories full from here on
    farthest = [max(q - min(deps[q]) for q in range(warm, n)) for deps in (txl_deps, comp_deps)]
    assert tuple(farthest) == hand_farthest == (task.farthest(False), task.farthest(True))
    tokens, targets, distances = recall.make_stream(task, n, torch.Generator().manual_seed(3))
    payload_at = [p for p, t in enumerate(tokens.tolist()) if task.n_fillers <= t < task.query_token]
    queries = [(q, d) for q, d in enumerate(distances.tolist()) if d > 0 and q >= warm]
    assert task.bands() == hand_bands
    assert {d for _, d in queries} == {d for lo, hi in hand_bands.values() for d in range(lo, hi + 1)}
    for q, d in queries:
        source = [q - d - k for k in range(c)]  # the held payload: its last copy at distance d
        assert all(tokens[p] == targets[q] for p in source) and (q - d - c + 1) % c == 0
        seen_txl = [p for p in payload_at if p in txl_deps[q]]
        seen_comp = [p for p in payload_at if p in comp_deps[q]]
        if d <= n_m:  # near: both see it, uncompressed, and no other payload
            assert sorted(seen_txl) == sorted(seen_comp) == sorted(source)
            assert not any(p in comp_slots[q] for p in source) or layers > 1
        elif d <= n_m + c * n_cm:  # far: the Transformer-XL sees no payload at all; the Compressive one this one,
            assert seen_txl == [] and sorted(seen_comp) == sorted(source)  # as one compressed slot of c copies
            if layers == 1:
                assert comp_slots[q][source[0]] == tuple(sorted(source))
        else:  # beyond: no payload in reach of either
            assert seen_txl == seen_comp == []


def test_script_runs_end_to_end(capsys):
    rows = recall.main(["--steps", "3", "--eval_streams", "2", "--eval_tokens", "256", "--d_model", "16",
                        "--n_heads", "2", "--seq_len", "4", "--mem_len", "4", "--cmem_len", "4"])
    assert [(r["model"], r["band"]) for r in rows] == [(m, b) for m in ("Compressive", "Transformer-XL")
                                                      for b in ("near", "far", "beyond")]
    assert all(0 <= r["accuracy"] <= 1 and r["queries"] > 0 for r in rows)
    assert [r["n_m"] for r in rows] == [4] * 3 + [8] * 3 and [r["n_cm"] for r in rows] == [4] * 3 + [0] * 3
    assert [r["in_range"] for r in rows] == ["all", "all", "none", "all", "none", "none"]
    out = capsys.readouterr().out
    assert "Transformer-XL: every query sees distances 1-8, no query sees beyond 11" in out
    assert "Compressive: every query sees distances 1-12, no query sees beyond 15" in out
