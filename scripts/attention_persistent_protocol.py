# Protocol model of kernels/attention_wgmma.cu's attention_prefill_persistent_kernel (one block),
# at warp granularity, under random interleavings of the warps, the copies landing and the MMAs
# retiring (python3 scripts/attention_persistent_protocol.py [runs]; MUT=nowaitk|nolastv|noqempty
# break the protocol on purpose, and the model must fail). A deadlock shows as "too long". Checks: arrivals land in their own phase, parity waits never pass early, no
# write into a K/V stage or Q buffer while a read of its old content is pending or still to come,
# every read sees the right landed content, no deadlock, no in-flight copy at exit.
import random, sys, os
MUT = os.environ.get("MUT", "")

class Bar:
    def __init__(s, name, count):
        s.name, s.count, s.pending, s.tx, s.ph = name, count, count, 0, 0
    def arrive(s, w, phase, tx=0):
        assert phase == s.ph, f"{s.name}: arrival for phase {phase} lands in phase {s.ph}"
        s.pending -= w; s.tx += tx
        assert s.pending >= 0
        s.check()
    def complete_tx(s, phase):
        assert phase == s.ph, f"{s.name}: tx for phase {phase} lands in phase {s.ph}"
        s.tx -= 1; s.check()
    def check(s):
        if s.pending == 0 and s.tx == 0:
            s.ph += 1; s.pending = s.count
    def passed(s, parity):  # try_wait.parity
        return (s.ph & 1) != parity

def cdiv(a, b): return -(-a // b)

def make_items(rng):
    H = rng.choice([1, 2, 4]); S = rng.randint(1, 4); group = rng.choice([1, 2, 4, 8])
    bs = rng.choice([4, 8, 16, 32, 128])
    qs, kvs = [], []
    for _ in range(S):
        q = rng.choice([1, 2, 16, 17, 64, 100, 129, 300])
        kv = q + rng.choice([0, 0, 1, 15, 100, 400])
        qs.append(q); kvs.append(kv)
    R = cdiv(max(qs) * group, 128)
    n_items = H * S * R
    G = rng.randint(1, min(n_items, 5)); b = rng.randrange(G)
    items = []
    for i in range(b, n_items, G):
        kvh = i % H; seq = i // H % S; row0 = (R - 1 - i // (H * S)) * 128
        n_rows = qs[seq] * group
        if row0 >= n_rows: continue
        pos0 = kvs[seq] - qs[seq]
        lim = lambda row: pos0 + min(row, n_rows - 1) // group + 1
        bl = lim(row0 + 127); nt = max(cdiv(bl, 128), 0)
        wgt = []
        for mw in range(2):
            wr = row0 + 64 * mw
            wgt.append(cdiv(lim(wr + 63), 128) if wr < n_rows else 0)
        assert all(w <= nt for w in wgt)
        items.append((nt, wgt))
    return items

def run(seed):
    rng = random.Random(seed)
    items = make_items(rng)
    B = {}
    for nm, c in [("q_full", 128), ("q_empty", 256), ("k_full", 129), ("k_empty", 256), ("v_full", 129), ("v_empty", 256)]:
        for k in range(2): B[nm, k] = Bar(f"{nm}[{k}]", c)
    # smem content: slot -> dict(tile, writes_pending, readers(set of open mma ids))
    mem = {}
    for kind in ("Q", "K", "V"):
        for k in range(2): mem[kind, k] = dict(tag=None, wpend=0, reads=set())
    # tiles/items each math warpgroup still has to read: (kind, tag) -> set of wgs
    need = {}
    asyncs = []   # pending async events: callables
    mmas = {}     # (wg, n) -> dict(issued=set(warps), done=False, reads=[(kind,slot)])
    def start_write(kind, slot, tag):
        m = mem[kind, slot]
        assert not m["reads"], f"write {kind}{slot}<-{tag} while MMA reads open {m['reads']}"
        old = m["tag"]
        if old is not None and old != tag:
            assert not need.get((kind, old)), f"write {kind}{slot}<-{tag} while {old} still needed by {need.get((kind, old))}"
        m["tag"] = tag
        m["wpend"] += 1
    def land(kind, slot):
        mem[kind, slot]["wpend"] -= 1
    def check_read(kind, slot, tag):
        m = mem[kind, slot]
        assert m["tag"] == tag and m["wpend"] == 0, f"read {kind}{slot} wants {tag}, holds {m['tag']} pending {m['wpend']}"

    # future reads: K(g) by an active wg, V(g) active, Q(item) by both wgs (S by active, epilogue by all)
    g = 0
    for qi, (nt, wgt) in enumerate(items):
        need[("Q", qi)] = {0, 1}
        for kt in range(nt):
            ws = {w for w in range(2) if kt < wgt[w]}
            if ws: need[("K", g + kt)] = set(ws); need[("V", g + kt)] = set(ws)
        g += nt

    def producer(warp):
        qi = 0; g = 0; mycp = []
        for (nt, wgt) in items:
            qb = qi & 1
            if qi >= 2 and MUT != "noqempty":
                while not B["q_empty", qb].passed(((qi >> 1) - 1) & 1): yield
            start_write("Q", qb, qi)
            ph = qi >> 1
            ev = [False]
            def qland(qb=qb, ph=ph, ev=ev):
                land("Q", qb); ev[0] = True; B["q_full", qb].arrive(32, ph)
            asyncs.append(qland); mycp.append(ev)
            yield
            for kt in range(nt):
                st = g & 1
                for half in ("K", "V"):
                    if g >= 2:
                        while not B[half.lower() + "_empty", st].passed(((g >> 1) - 1) & 1): yield
                    full = B[half.lower() + "_full", st]
                    if warp == 0:
                        full.arrive(1, g >> 1, tx=1)
                        start_write(half, st, g)
                        def tma(half=half, st=st, ph=g >> 1):
                            land(half, st); B[half.lower() + "_full", st].complete_tx(ph)
                        asyncs.append(tma)
                    start_write(half, st, g)
                    ev = [False]
                    def cpl(half=half, st=st, ph=g >> 1, ev=ev):
                        land(half, st); ev[0] = True; B[half.lower() + "_full", st].arrive(32, ph)
                    asyncs.append(cpl); mycp.append(ev)
                    yield
                g += 1
            qi += 1
        while not all(e[0] for e in mycp): yield  # cp.async.wait_all
        return

    mma_n = [0]
    def new_mma(wg, reads):
        key = (wg, mma_n[0]); mma_n[0] += 1
        mmas[key] = dict(issued=0, done=False, reads=reads)
        for r in reads: mem[r[0], r[1]]["reads"].add(key)
        return key

    # warpgroup-collective MMA: every warp issues; completion async after all 4 issued
    wg_state = {0: {}, 1: {}}
    def issue(wg, warp, idx, reads, tags):
        for (kind, slot), tag in zip(reads, tags): check_read(kind, slot, tag)
        st = wg_state[wg]
        if idx not in st:
            st[idx] = new_mma(wg, reads)
        m = mmas[st[idx]]; m["issued"] += 1
        if m["issued"] == 4:
            key = st[idx]
            def fin(key=key):
                mmas[key]["done"] = True
                for r in mmas[key]["reads"]: mem[r[0], r[1]]["reads"].discard(key)
            asyncs.append(fin)
    def outstanding(wg, upto):
        return [k for i, k in wg_state[wg].items() if i < upto and not mmas[k]["done"]]

    bar_named = {0: [0, 0], 1: [0, 0]}  # (arrived count, generation)
    def math(wg, warp):
        qi = 0; g = 0; n = 0  # n: this warp's mma issue index (same sequence in every warp of the wg)
        for (nt, wgt) in items:
            qb = qi & 1; wt = wgt[wg]
            while not B["q_full", qb].passed((qi >> 1) & 1): yield
            def wait_k(gt):
                while not B["k_full", gt & 1].passed((gt >> 1) & 1): yield
            def wait_v(gt):
                while not B["v_full", gt & 1].passed((gt >> 1) & 1): yield
            if wt > 0:
                yield from wait_k(g)
                issue(wg, warp, n, [("Q", qb), ("K", g & 1)], [qi, g]); n += 1
                s_key_idx = n - 1
            yield
            for kt in range(nt):
                gt = g + kt
                while outstanding(wg, n): yield  # wait<0>
                active = kt < wt; more = kt + 1 < wt
                if warp == 0:
                    if active: need[("K", gt)].discard(wg)
                    if kt > 0 and (kt - 1) < wt: need[("V", gt - 1)].discard(wg)
                if not active and MUT != "nowaitk": yield from wait_k(gt)
                B["k_empty", gt & 1].arrive(32, gt >> 1)
                if kt > 0: B["v_empty", (gt - 1) & 1].arrive(32, (gt - 1) >> 1)
                yield
                if more: yield from wait_k(gt + 1)
                yield from wait_v(gt)
                if active: issue(wg, warp, n, [("V", gt & 1)], [gt]); n += 1
                if more: issue(wg, warp, n, [("Q", qb), ("K", (gt + 1) & 1)], [qi, gt + 1]); n += 1
                yield
            while outstanding(wg, n): yield
            if nt > 0 and MUT != "nolastv":
                if warp == 0 and nt - 1 < wt: need[("V", g + nt - 1)].discard(wg)
                B["v_empty", (g + nt - 1) & 1].arrive(32, (g + nt - 1) >> 1)
            g += nt
            # epilogue: write own rows of Q buffer qb (the wg's own S reads retired: checked by reads set per wg)
            for key in mem["Q", qb]["reads"]:
                assert key[0] != wg, "staging over Q rows still read by this wg's MMA"
            check_read("Q", qb, qi)
            yield
            # bar.sync among the wg's 4 warps
            gen = bar_named[wg][1]; bar_named[wg][0] += 1
            if bar_named[wg][0] == 4: bar_named[wg][0] = 0; bar_named[wg][1] += 1
            while bar_named[wg][1] == gen: yield
            check_read("Q", qb, qi)  # the stores read the staging
            yield
            # the wg's last warp to finish marks Q no longer needed (model: each warp, count)
            done_q.setdefault((qi, wg), 0)
            done_q[(qi, wg)] += 1
            if done_q[(qi, wg)] == 4: need[("Q", qi)].discard(wg)
            B["q_empty", qb].arrive(32, qi >> 1)
            qi += 1
        return

    done_q = {}
    aw = rng.choice([1, 3, 10])
    agents = [producer(w) for w in range(4)] + [math(wg, w) for wg in range(2) for w in range(4)]
    alive = list(range(len(agents)))
    steps = 0
    while alive or asyncs:
        steps += 1
        assert steps < 2_000_000, "too long"
        c = rng.randrange(len(alive) + (aw if asyncs else 0)) if alive else len(alive)
        if c >= len(alive):
            ev = asyncs.pop(rng.randrange(len(asyncs)))
            ev()
            continue
        a = alive[c]
        try:
            next(agents[a])
        except StopIteration:
            alive.remove(a)
            if not alive:
                assert not asyncs, f"block exits with {len(asyncs)} copies or MMAs in flight"
    # everything consumed
    for k, v in need.items():
        assert not v, f"{k} never read by {v}"
    return len(items)

if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    tot = 0
    for seed in range(n):
        try:
            tot += run(seed)
        except AssertionError as e:
            print("seed", seed, "FAILED:", e); raise
    print("ok", n, "runs,", tot, "items")
