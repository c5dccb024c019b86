"""Per-window diagnosis of a padded W = 8 window cell (session 27, helper "it"; README.md here).

usage: analyze.py DUMP PART a b c k m [L]
  DUMP: stderr of batching_sim built with window_dump.patch and run with ODB_IT_DEBUG=1 --unequal-microsteps: per
        window "WIN idx T_b equal_counts_bound any_counts_bound n bound_n fewest samples" then one "RANK r [ lens ] ..."
        line per rank (its micro-steps as planned, the simulator's schedule). PART: which trace (0-based, in --traces
        order; a trace's windows start again at index 1).
  a b c k m: the simulator's step model (bench/step_models.yaml); L: the padded budget (4096).

Prints, over the trace's windows:
  * T (sum of the slowest ranks), the equal-counts ceiling of bench/window_bound.cc (the CSV column), and their split
    into the mean rank's excess and the imbalance;
  * at the planned micro-step count n: the layout's padding (sum of g over its micro-steps) over the least padding in
    exactly W n groups, and max - mean;
  * a tighter lower bound for equal counts (below), for IDLE rank-steps per window at most 0, 1, 2, 3 or any;
  * the fewest padded groups of each window's samples (greedy runs of the sorted lengths, which are the fewest) and
    the share of the target a window of the same length mix may hold to fit 4 micro-steps per rank.

The tighter bound (valid for any layout of the window's samples with n' micro-steps on every rank, n' in {n, n + 1},
within the budget): rank r runs j_r <= n' non-empty micro-steps (n' - j_r IDLE at a each), G = sum j_r.
  (mean)  T >= n' a + (P_G + c Q) / W, P_G the least sum of g(count x longest) over partitions into EXACTLY G groups
          (runs of the sorted samples reach it: window_bound.cc's argument keeps the group count);
  (caps)  rank r's real tokens R_r <= j_r x pmax (pmax: the most padded tokens any group of these samples can have
          within the budget) and T - n' a >= b (R_r + k j_r) + c l_min R_r (g(p) >= b (p + k), p >= real tokens,
          len^2 >= l_min len); with sum R_r = R, the least T with sum_r min(j_r pmax, (T - n' a - b k j_r) / (b + c
          l_min)) >= R.
  T >= min over n' and over j vectors (IDLE cap applied) of max(mean, caps); and >= the CSV's equal-counts bound.
  A window whose samples need more IDLE rank-steps than a cap (fewer samples than slots, none of them pairing within
  the budget) counts with its bound for any IDLE under that cap.
Checked: the bound never exceeds a window's planned time (T is printed to 9 digits: 1e-8 relative slack).
"""
import itertools
import sys
from collections import Counter


def main():
    dump, part = sys.argv[1], int(sys.argv[2])
    a, b, c, k, m = (float(x) for x in sys.argv[3:8])
    L = int(sys.argv[8]) if len(sys.argv) > 8 else 4096
    W = 8

    def g(p):
        return max(m, b * (p + k))

    def cost(s):
        return a if not s else a + g(len(s) * max(s)) + c * sum(x * x for x in s)

    parts, cur = [], None
    for line in open(dump):
        t = line.split()
        if not t or t[0] not in ('WIN', 'RANK'):
            continue
        if t[0] == 'WIN':
            if t[1] == '1':
                cur = []
                parts.append(cur)
            cur.append(dict(T=float(t[2]), B=float(t[3]), n=int(t[5]), ranks=[]))
        else:
            steps = line.split('[')[1:]
            cur[-1]['ranks'].append([[int(x) for x in s.replace(']', '').split()] for s in steps])
    wins = parts[part]
    W = len(wins[0]['ranks'])

    def exact_groups(s, gmax):  # out[G - 1]: least sum of g over partitions of sorted s into exactly G groups
        inf = float('inf')
        prev = [inf] * (len(s) + 1)
        prev[0] = 0.0
        out = []
        for _ in range(gmax):
            cur_ = [inf] * (len(s) + 1)
            for i in range(1, len(s) + 1):
                best = inf
                for j in range(i - 1, -1, -1):
                    if (i - j) * s[j] > L and i - j > 1:  # a lone sample over the budget is a group of its own
                        break
                    v = prev[j] + g((i - j) * s[j])
                    if v < best:
                        best = v
                cur_[i] = best
            out.append(cur_[len(s)])
            prev = cur_
        return out

    def pmax(s):
        asc = sorted(s)
        return max(max(1, min(L // l, i + 1)) * l for i, l in enumerate(asc))

    def fewest(s):
        s = sorted(s, reverse=True)
        runs = i = 0
        while i < len(s):
            cnt = 0
            while i < len(s) and (cnt + 1) * s[i - cnt] <= L:
                cnt += 1
                i += 1
            runs += 1
        return runs

    T = sum(w['T'] for w in wins)
    B = sum(w['B'] for w in wins)
    mean = sum(sum(sum(cost(st) for st in r) for r in w['ranks']) / W for w in wins)
    print(f'windows {len(wins)}, micro-steps per window {dict(Counter(w["n"] for w in wins))}')
    print(f'T = {T:.4f} s; equal-counts ceiling (CSV) {B:.4f} = {B / T:.4f} T; mean rank {mean:.4f} '
          f'(imbalance {T / mean - 1:.4%}, mean over the ceiling {mean / B - 1:.4%})')
    pad = imb = 0.0
    caps = (0, 1, 2, 3, None)
    tight = {cap: 0.0 for cap in caps}
    tokens = []
    for w in wins:
        s = sorted((x for r in w['ranks'] for st in r for x in st), reverse=True)
        n = w['n']
        R, Q, lmin, pm = sum(s), sum(x * x for x in s), s[-1], pmax(s)
        P = exact_groups(s, W * (n + 1))
        rs = [sum(cost(st) for st in r) for r in w['ranks']]
        pad += (sum(g(len(st) * max(st)) for r in w['ranks'] for st in r if st) - P[W * n - 1]) / W
        imb += max(rs) - sum(rs) / W
        any_idle = None
        for cap in reversed(caps):  # any IDLE first: a window whose samples need more IDLE than a cap keeps that one
            best = float('inf')
            for nn in (n, n + 1):
                for js in itertools.combinations_with_replacement(range(nn + 1), W):
                    G = sum(js)
                    if G == 0 or (cap is not None and W * nn - G > cap) or P[G - 1] == float('inf'):
                        continue
                    if sum(j * pm for j in js) < R:
                        continue
                    lo, hi = 0.0, 100.0
                    for _ in range(60):
                        mid = (lo + hi) / 2
                        room = sum(min(j * pm, max(0.0, (mid - b * k * j) / (b + c * lmin))) for j in js if j)
                        lo, hi = (lo, mid) if room >= R else (mid, hi)
                    best = min(best, nn * a + max((P[G - 1] + c * Q) / W, hi))
            if cap is None:
                any_idle = best
                assert max(best, w['B']) <= w['T'] * (1 + 1e-8), ('bound above the planned layout', w['T'], best)
            elif best == float('inf'):
                best = any_idle
            tight[cap] += max(best, w['B'])
        tokens.append((fewest(s), R / (W * 4 * L)))
    print(f'at the planned n: padding over the least in exactly W n groups {pad / T:.4%} of T, imbalance {imb / T:.4%}')
    for cap in caps:
        print(f'tighter equal-counts bound, IDLE rank-steps per window <= {"any" if cap is None else cap}: '
              f'{tight[cap]:.4f} s = {tight[cap] / T:.4f} T')
    full = [(f, r) for f, r in tokens if r > 0.5]
    if not full:  # windows of well under 4 budgets a rank (1m targets): no 4-micro-step question
        return
    print(f'fewest padded groups per window (full windows): {dict(sorted(Counter(f for f, _ in full).items()))}; '
          f'a window of the same mix fits 4 micro-steps per rank at <= 32 / fewest of its size: mean '
          f'{sum(32 / f * r for f, r in full) / len(full):.3f}, max {max(32 / f * r for f, r in full):.3f} of 4 budgets '
          f'(these windows: {sum(r for _, r in full) / len(full):.3f})')


if __name__ == '__main__':
    main()
