#!/usr/bin/python3
"""What odb packed loses in the `cpu_calibrated` image_text cell at W = 64 with 20k samples
(docs/benchmarks.md, "The peers", item (2)), over the largest-sample bound:

  bazel build -c opt //bench:batching_sim && BIN=$(bazel info -c opt bazel-bin)
  mkdir -p /tmp/cell/traces
  $BIN/bench/batching_sim --model cpu_calibrated --world 64 --samples 20000 --window 512 \
    --policies odb:global:q32:w512:paced16:full:packed \
    --traces chat_longtail,image_text,high_variance,production_mix,bench/traces/debian_docs.txt \
    --csv /tmp/cell/run.csv --ranks-csv /tmp/cell/ranks.csv --save-traces-dir /tmp/cell/traces
  /usr/bin/python3 bench/results/peers/largest_sample_cell/analyse.py /tmp/cell

Prints (1) the time over the bound split into the largest sample's step, the other steps' imbalance
(max - mean per step) and rank steps beyond the fewest; (2) the imbalance that the best dealing of
odb's own rows to steps leaves (rows sorted by cost, cut into steps of W: optimal for a sum of
per-step maxima with W rows a step); (3) an offline emulation of forming each step's rows together
(the longest remaining sample first, into the row of least cost that has room; x1's row left alone),
a planner change this project has not made (the whole trace fits one odb window here: 512 x 64 >
20000 samples).
"""
import csv
import os
import sys

A, B, C = 0.00458612, 6.53708e-05, 4.47055e-07  # bench/step_models.yaml, cpu_calibrated
W, L = 64, 4096
TRACE, POLICY = "image_text", "odb:global:q32:w512:paced16:full:packed"


def cost(row):
    return A + B * sum(row) + C * sum(x * x for x in row)


def main(d):
    run = next(r for r in csv.DictReader(open(os.path.join(d, "run.csv"))) if r["trace"] == TRACE)
    bound, ls_bound = float(run["bound_seconds"]), float(run["largest_sample_bound_seconds"])
    steps = {}
    for r in csv.DictReader(open(os.path.join(d, "ranks.csv"))):
        if r["trace"] == TRACE and r["policy"] == POLICY and r["window_tokens"] == "0":
            steps.setdefault(int(r["step"]), []).append(r)
    lens = sorted((int(l.split()[0]) for l in open(os.path.join(d, "traces", TRACE + ".txt"))
                   if not l.startswith("#")), reverse=True)
    l1 = lens[0]
    alone = A + B * l1 + C * l1 * l1
    t = sum(max(float(r["cost"]) for r in v) for v in steps.values())
    excess = {k: max(float(r["cost"]) for r in v) - sum(float(r["cost"]) for r in v) / W for k, v in steps.items()}
    k1 = next(k for k, v in steps.items() if any(float(r["sum_len_sq"]) >= l1 * l1 for r in v))
    rank_steps = sum(len(v) for v in steps.values())
    print(f"T {t:.4f} s, any-layout bound {bound:.4f} (of it {bound / t:.4f}), largest-sample bound "
          f"{ls_bound:.4f} (of it {ls_bound / t:.4f}; ceiling {bound / ls_bound:.5f}); over it {t - ls_bound:.3f} s")
    print(f"  the largest sample's step {k1}: excess {excess[k1]:.4f} s, of which the bound accounts for "
          f"{ls_bound - bound:.4f}: {excess[k1] - (ls_bound - bound):.3f} s; its max rank {max(float(r['cost']) for r in steps[k1]):.4f} s "
          f"vs x1 alone {alone:.4f} s")
    others = sorted(((e, k) for k, e in excess.items() if k != k1), reverse=True)
    print(f"  the other {len(others)} steps' imbalance {sum(e for e, _ in others):.4f} s; worst: "
          + ", ".join(f"step {k} {e:.3f}" for e, k in others[:4]))
    print(f"  rank steps {rank_steps} (IDLE included): the rest of the gap, {t - ls_bound - excess[k1] + (ls_bound - bound) - sum(e for e, _ in others):.4f} s")
    rows = sorted((float(r["cost"]) for k, v in steps.items() if k != k1 for r in v), reverse=True)
    dealt = sum(max(rows[i:i + W]) - sum(rows[i:i + W]) / W for i in range(0, len(rows), W))
    print(f"(2) odb's {len(rows)} other rows dealt at best (sorted, cut into steps of {W}): imbalance {dealt:.4f} s")
    # (3) x1 alone; its step's other rows: best-fit decreasing of the longest samples (as odb's).
    first = [[l1]] + [[] for _ in range(W - 1)]
    fill, used = [0] * (W - 1), [False] * len(lens)
    used[0] = True
    for i in range(1, len(lens)):
        fits = [r for r in range(W - 1) if fill[r] + lens[i] <= L]
        if fits:
            r = max(fits, key=lambda r: fill[r])
            first[r + 1].append(lens[i])
            fill[r] += lens[i]
            used[i] = True
        if min(fill) >= L - 100:
            break
    items = [lens[i] for i in range(len(lens)) if not used[i]]
    t3, n3, last = max(cost(r) for r in first), 1, None
    while items:
        rows3, left = [[] for _ in range(W)], []
        for x in items:
            fits = [r for r in range(W) if sum(rows3[r]) + x <= L]
            if not fits:
                left.append(x)
                continue
            rows3[min(fits, key=lambda r: cost(rows3[r]) if rows3[r] else 0.0)].append(x)
        step_costs = [cost(r) for r in rows3 if r]
        t3 += max(step_costs)
        last = (len(step_costs), max(step_costs) - sum(step_costs) / W)
        n3 += 1
        items = left
    print(f"(3) each step's rows formed together: {n3} steps, T {t3:.4f} s, of the any-layout bound {bound / t3:.4f}, "
          f"of the largest-sample bound {ls_bound / t3:.4f}; its last step ({last[0]} rows) has {last[1]:.3f} s of imbalance")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/cell")
