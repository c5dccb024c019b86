#!/usr/bin/python3
"""Inter-node bytes of the global planner's steps against the exact minimum (issue 22, item 4).

    bazel build -c opt //bench:scale_bench
    /usr/bin/python3 bench/exchange_optimum.py --bin bazel-bin/bench/scale_bench --out bench/results

For 2, 4 and 8 nodes of --lws ranks, scale_bench runs production-shaped rounds
(balance::GlobalPlanner, locality 0, with its node re-split of each step
over pairs and triples of nodes, src/balance/node_placement.h; padded budget L_max 4096, step model
a = 512, b = 1, chat_longtail lengths; smaller windows than production so that
every instance is solved to optimality) and dumps the last round's steps
(--dump-plan). For every step the planner made, an ILP solver (CBC by default; GLPK's
glpsol with --solver glpk, same model file) solves the
exact minimum of the inter-node payload bytes over every way to run THE SAME
SAMPLES in that step on the W ranks such that

  * every sample runs on exactly one rank, every rank gets >= 1 sample (when
    the planner's step has no IDLE rank),
  * every rank's group fits the budget (padded: group size x longest <= L_max,
    a lone sample always fits), and
  * no rank's step time exceeds the planner's step time (the slowest rank's),
    so the optimum gives up no balance.

A sample owned by rank o moves inter-node when it runs on a rank of another
node (node = rank / lws). The ILP: x[s, r] = 1 if sample s runs on rank r;
y[r, l] = 1 if rank r's longest sample has length level l (the step's
distinct lengths); x[s, r] <= sum of y[r, l] over levels >= len(s); group
size <= sum over l of cap(l) y[r, l], cap(l) = the most samples of longest
length L_l that fit both the budget and the step time (--model rank). The
same minimum per node (--model node) and over counts per node and level
(--model count, the default: the one that proves 8 nodes; see count_lp).
Exact for the padded model with no per_len_sq term (what the benchmark
uses; asserted).

The planner's choice of which samples share a step is taken as given; the
ratio compares how it spreads a step's samples over nodes with the best
spread of the same samples. Prints a table and writes
exchange_optimum.{json,md}: per instance (nodes, seed) the planner's and the
optimum's inter-node bytes summed over its steps, and the ratio.
"""
import argparse
import json
import math
import pathlib
import re
import subprocess
import sys
import tempfile


def step_lp(step, world, lws, cfg, require_nonempty):
    samples = step["samples"]
    a, b = cfg["per_step"], cfg["per_padded_token"]
    levels = sorted({s[2] for s in samples})
    node = [r // lws for r in range(world)]
    lines = ["Minimize", " obj:"]
    terms = []
    for i, (_, owner, _, payload) in enumerate(samples):
        for r in range(world):
            if node[r] != node[owner]:
                terms.append(f"{payload} x_{i}_{r}")
    lines.append("  " + (" + ".join(terms) if terms else "0 x_0_0"))
    lines.append("Subject To")
    for i in range(len(samples)):
        lines.append(f" one_{i}: " + " + ".join(f"x_{i}_{r}" for r in range(world)) + " = 1")
    for r in range(world):
        op = "=" if require_nonempty else "<="
        lines.append(f" lvl_{r}: " + " + ".join(f"y_{r}_{l}" for l in range(len(levels))) + f" {op} 1")
        for i, s in enumerate(samples):
            ok = [l for l, length in enumerate(levels) if length >= s[2]]
            lines.append(f" fit_{i}_{r}: x_{i}_{r} - " + " - ".join(f"y_{r}_{l}" for l in ok) + " <= 0")
        caps = []
        for length in levels:
            budget_cap = max(1, cfg["max_tokens"] // length) if cfg["max_tokens"] else len(samples)
            time_cap = math.floor((step["cost"] - a) / (b * length) + 1e-9) if b > 0 else len(samples)
            caps.append(max(0, min(budget_cap, time_cap, len(samples))))
        lines.append(f" size_{r}: " + " + ".join(f"x_{i}_{r}" for i in range(len(samples))) + " - " +
                     " - ".join(f"{caps[l]} y_{r}_{l}" for l in range(len(levels))) + " <= 0")
        if require_nonempty:
            lines.append(f" some_{r}: " + " + ".join(f"x_{i}_{r}" for i in range(len(samples))) + " >= 1")
    # Ranks of one node are interchangeable (same objective, same caps):
    # order them by their longest level, which removes the equivalent
    # permutations from the branch-and-bound without changing the optimum.
    for r in range(world - 1):
        if node[r] == node[r + 1]:
            lines.append(f" sym_{r}: " + " + ".join(f"{l} y_{r}_{l}" for l in range(1, len(levels))) + " - " +
                         " - ".join(f"{l} y_{r + 1}_{l}" for l in range(1, len(levels))) + " >= 0")
    lines.append("Binary")
    for i in range(len(samples)):
        lines.append(" " + " ".join(f"x_{i}_{r}" for r in range(world)))
    for r in range(world):
        lines.append(" " + " ".join(f"y_{r}_{l}" for l in range(len(levels))))
    lines.append("End")
    return "\n".join(lines) + "\n"


def caps_of(levels, step, cfg, n):
    """cap(l): the most samples of longest length levels[l] one rank may run (budget and step time)."""
    a, b = cfg["per_step"], cfg["per_padded_token"]
    caps = []
    for length in levels:
        budget_cap = max(1, cfg["max_tokens"] // length) if cfg["max_tokens"] else n
        time_cap = math.floor((step["cost"] - a) / (b * length) + 1e-9) if b > 0 else n
        caps.append(max(0, min(budget_cap, time_cap, n)))
    return caps


def node_lp(step, world, lws, cfg, require_nonempty):
    """The same minimum as step_lp, per node instead of per rank (--model node).

    z[s, n] = 1 if sample s runs on node n; w[n, l] = how many of node n's
    ranks run a group whose longest length is level l (sum over l = the
    node's ranks). A sample of length len may run on any group of level >=
    len, so the groups a set of samples may use are nested (longer samples,
    fewer groups), and Hall's condition on the nested sets is enough: for
    every level j, the node's samples of length >= L_j number at most
    sum over l >= j of cap(l) w[n, l]. With every rank non-empty, a node also
    needs at least as many samples as ranks (a rank left without a sample
    takes the shortest one of a group of >= 2 and runs it at its own level).
    The ranks of a node are interchangeable, so the rank-level model's
    symmetry is gone.
    """
    samples = step["samples"]
    levels = sorted({s[2] for s in samples})
    caps = caps_of(levels, step, cfg, len(samples))
    nodes = (world + lws - 1) // lws
    ranks = [min(world, (n + 1) * lws) - n * lws for n in range(nodes)]
    lines = ["Minimize", " obj:"]
    terms = [f"{payload} z_{i}_{n}" for i, (_, owner, _, payload) in enumerate(samples)
             for n in range(nodes) if n != owner // lws]
    lines.append("  " + (" + ".join(terms) if terms else "0 z_0_0"))
    lines.append("Subject To")
    for i in range(len(samples)):
        lines.append(f" one_{i}: " + " + ".join(f"z_{i}_{n}" for n in range(nodes)) + " = 1")
    for n in range(nodes):
        lines.append(f" ranks_{n}: " + " + ".join(f"w_{n}_{l}" for l in range(len(levels))) + f" = {ranks[n]}")
        for j, length in enumerate(levels):
            longer = [i for i, s in enumerate(samples) if s[2] >= length]
            lines.append(f" hall_{n}_{j}: " + " + ".join(f"z_{i}_{n}" for i in longer) + " - " +
                         " - ".join(f"{caps[l]} w_{n}_{l}" for l in range(j, len(levels))) + " <= 0")
        if require_nonempty:
            lines.append(f" some_{n}: " + " + ".join(f"z_{i}_{n}" for i in range(len(samples))) + f" >= {ranks[n]}")
    lines.append("Bounds")
    for n in range(nodes):
        for l in range(len(levels)):
            lines.append(f" 0 <= w_{n}_{l} <= {ranks[n]}")
    lines.append("General")
    for n in range(nodes):
        lines.append(" " + " ".join(f"w_{n}_{l}" for l in range(len(levels))))
    lines.append("Binary")
    for i in range(len(samples)):
        lines.append(" " + " ".join(f"z_{i}_{n}" for n in range(nodes)))
    lines.append("End")
    return "\n".join(lines) + "\n"


def count_lp(step, world, lws, cfg, require_nonempty):
    """The same minimum again, over counts instead of samples (--model count, the default).

    Two facts shrink the node model to a few hundred integers. (1) Lengths
    with the same cap(l) are one level: a group whose longest is L may as well
    be counted at the longest length of L's cap class (same cap, admits more
    samples), so a sample's level is the shortest such class top >= its
    length. (2) Samples of one level are interchangeable to every constraint,
    and a sample's cost depends only on whether it stays on its owner's node,
    not on where it goes: so the model chooses y[n, l] (samples of level l
    on node n), s[o, l] <= y[o, l] (samples of owner node o and level l that
    stay home), and w[n, l] as in the node model, with Hall's condition on
    y. The samples of (o, l) that leave are its cheapest ones: with their
    payloads sorted ascending p_1 <= p_2 <= ..., moving m of them costs
    p_1 + ... + p_m, a convex function of m, written as sum_k p_k d[o, l, k]
    with 0 <= d <= 1 and sum_k d[o, l, k] = count(o, l) - s[o, l] (the LP
    takes the cheapest increments first). A leaving sample counted onto its
    own node would only be charged for nothing, so letting the leavers go
    anywhere changes no optimum. Samples whose owner is no rank of the step
    always count. Returns the LP text; the constant is in the objective as
    the fixed variable `fixed` (= 1).
    """
    samples = step["samples"]
    lengths = sorted({s[2] for s in samples})
    caps = caps_of(lengths, step, cfg, len(samples))
    tops, top_cap = [], []  # each cap class's longest length, and its cap
    for length, c in zip(lengths, caps):
        if top_cap and top_cap[-1] == c:
            tops[-1] = length
        else:
            tops.append(length)
            top_cap.append(c)
    level = {length: next(l for l, top in enumerate(tops) if length <= top) for length in lengths}
    nodes = (world + lws - 1) // lws
    ranks = [min(world, (n + 1) * lws) - n * lws for n in range(nodes)]
    levels = len(tops)
    count = [0] * levels
    homed = {}  # (owner node, level) -> payloads
    fixed = 0
    for _, owner, length, payload in samples:
        count[level[length]] += 1
        if 0 <= owner < world:
            homed.setdefault((owner // lws, level[length]), []).append(payload)
        else:
            fixed += payload
    lines = ["Minimize", " obj:"]
    terms = [f"{fixed} fixed"]
    for (o, l), pays in sorted(homed.items()):
        terms += [f"{p} d_{o}_{l}_{k}" for k, p in enumerate(sorted(pays))]
    lines.append("  " + " + ".join(terms))
    lines.append("Subject To")
    lines.append(" fix: fixed = 1")
    for (o, l), pays in sorted(homed.items()):
        lines.append(f" leave_{o}_{l}: " + " + ".join(f"d_{o}_{l}_{k}" for k in range(len(pays))) +
                     f" + s_{o}_{l} = {len(pays)}")
        lines.append(f" stay_{o}_{l}: s_{o}_{l} - y_{o}_{l} <= 0")
    for l in range(levels):
        lines.append(f" cover_{l}: " + " + ".join(f"y_{n}_{l}" for n in range(nodes)) + f" = {count[l]}")
    for n in range(nodes):
        lines.append(f" ranks_{n}: " + " + ".join(f"w_{n}_{l}" for l in range(levels)) + f" = {ranks[n]}")
        for j in range(levels):
            lines.append(f" hall_{n}_{j}: " + " + ".join(f"y_{n}_{l}" for l in range(j, levels)) + " - " +
                         " - ".join(f"{top_cap[l]} w_{n}_{l}" for l in range(j, levels)) + " <= 0")
        if require_nonempty:
            lines.append(f" some_{n}: " + " + ".join(f"y_{n}_{l}" for l in range(levels)) + f" >= {ranks[n]}")
    lines.append("Bounds")
    for (o, l), pays in sorted(homed.items()):
        lines += [f" 0 <= d_{o}_{l}_{k} <= 1" for k in range(len(pays))]
        lines.append(f" 0 <= s_{o}_{l} <= {len(pays)}")
    for n in range(nodes):
        for l in range(levels):
            lines.append(f" 0 <= w_{n}_{l} <= {ranks[n]}")
            lines.append(f" 0 <= y_{n}_{l} <= {count[l]}")
    lines.append("General")
    lines.append(" " + " ".join(f"s_{o}_{l}" for (o, l) in sorted(homed)))
    for n in range(nodes):
        lines.append(" " + " ".join(f"w_{n}_{l}" for l in range(levels)))
        lines.append(" " + " ".join(f"y_{n}_{l}" for l in range(levels)))
    lines.append("End")
    return "\n".join(lines) + "\n"


MODELS = {"count": count_lp, "node": node_lp, "rank": step_lp}


def solve(lp_text, tmlim, solver):
    """(status, objective, bound): bound is the solver's best lower bound when a time limit stopped it."""
    if solver == "cbc":
        return solve_cbc(lp_text, tmlim)
    with tempfile.TemporaryDirectory() as d:
        lp = pathlib.Path(d) / "step.lp"
        out = pathlib.Path(d) / "step.out"
        lp.write_text(lp_text)
        log = subprocess.run(["glpsol", "--lp", str(lp), "--tmlim", str(tmlim), "-o", str(out)],
                             capture_output=True, text=True).stdout
        text = out.read_text() if out.exists() else ""
    status = re.search(r"Status:\s+(.*)", text)
    objective = re.search(r"Objective:\s+obj = (\S+)", text)
    bound = None  # the branch-and-bound's best bound, when a time limit stopped it
    for m in re.finditer(r"mip =\s+(\S+) >=\s+([-+0-9.e]+)\s", log):
        bound = float(m.group(2))
    return (status.group(1).strip() if status else "no solution",
            float(objective.group(1)) if objective else None, bound)


def solve_cbc(lp_text, tmlim):
    with tempfile.TemporaryDirectory() as d:
        lp = pathlib.Path(d) / "step.lp"
        lp.write_text(lp_text)
        log = subprocess.run(["cbc", str(lp), "sec", str(tmlim), "threads", "1", "solve"],
                             capture_output=True, text=True).stdout
    result = re.search(r"Result - (.*)", log)
    objective = re.search(r"Objective value:\s+(\S+)", log)
    bound = re.search(r"Lower bound:\s+(\S+)", log)
    status = "INTEGER OPTIMAL" if result and result.group(1).startswith("Optimal") else (
        result.group(1).strip() if result else "no solution")
    return (status, float(objective.group(1)) if objective else None, float(bound.group(1)) if bound else None)


def planner_inter(step, lws):
    return sum(p for r, o, _, p in step["samples"] if r // lws != o // lws)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="bazel-bin/bench/scale_bench")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--nodes", default="2,4,8")
    p.add_argument("--lws", type=int, default=2)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--window", type=int, default=32, help="pending samples per rank (production: 512)")
    p.add_argument("--queue", type=int, default=4, help="emit queue: a round sees half of it free")
    p.add_argument("--rounds", type=int, default=2, help="the last round's steps are compared")
    p.add_argument("--tmlim", type=int, default=120, help="solver time limit per step, seconds")
    p.add_argument("--solver", choices=["cbc", "glpk"], default="cbc",
                   help="cbc (coinor-cbc) or glpk (glpsol, the same LP file; ~10x slower on these models)")
    p.add_argument("--model", choices=sorted(MODELS), default="count",
                   help="count: samples per level per node, stays per owner node and level (default; proves "
                        "8 nodes); node: z[sample, node] + groups per level per node; rank: x[sample, rank] + "
                        "a level per rank (the same minimum, ever slower to prove)")
    p.add_argument("--from-json", default=None, help="rewrite the table from this exchange_optimum.json, no runs")
    args = p.parse_args()
    if args.from_json:
        write(json.loads(pathlib.Path(args.from_json).read_text()), args)
        return
    rows = []
    for nodes in [int(x) for x in args.nodes.split(",")]:
        world = nodes * args.lws
        for seed in [int(x) for x in args.seeds.split(",")]:
            with tempfile.TemporaryDirectory() as d:
                dump = pathlib.Path(d) / "plan.json"
                subprocess.run([args.bin, "--world", str(world), "--lws", str(args.lws), "--rounds", str(args.rounds),
                                "--window", str(args.window), "--queue", str(args.queue), "--seed", str(seed),
                                "--dump-plan", str(dump)], check=True, capture_output=True)
                plan = json.loads(dump.read_text())
            assert plan["padded"] and plan["per_len_sq"] == 0, "the ILP models the padded budget without per_len_sq"
            got = best = bound_sum = 0.0
            steps = samples = 0
            all_optimal = True
            for step in plan["steps"]:
                ranks_used = {s[0] for s in step["samples"]}
                lp = MODELS[args.model](step, world, args.lws, plan, require_nonempty=len(ranks_used) == world)
                status, obj, bound = solve(lp, args.tmlim, args.solver)
                mine = planner_inter(step, args.lws)
                optimal = status.startswith("INTEGER OPTIMAL") and obj is not None
                if obj is None:
                    # No incumbent within the time limit (CBC's heuristics can
                    # miss on the node model): the planner's own placement is
                    # a feasible one; the bound is the solver's, else 0.
                    print(f"nodes {nodes} seed {seed}: {args.solver} found no solution in {args.tmlim} s ({status}); "
                          "the planner's placement is the best known", file=sys.stderr)
                    obj = mine
                all_optimal &= optimal
                got += mine
                best += obj
                bound_sum += obj if optimal else (bound if bound is not None else 0.0)
                steps += 1
                samples += len(step["samples"])
            row = {"nodes": nodes, "lws": args.lws, "world": world, "seed": seed, "model": args.model, "steps": steps,
                   "samples": samples, "planner_inter_bytes": got, "optimum_inter_bytes": best,
                   "optimum_lower_bound": bound_sum, "all_optimal": all_optimal}
            print(json.dumps(complete(row)), file=sys.stderr, flush=True)
            rows.append(row)
    write(rows, args)


def complete(row):
    """Adds the best known minimum and the ratio's range. A step the solver did
    not finish may have an incumbent worse than the planner's own placement
    (which is feasible), so the best known minimum is the smaller of the two,
    and the ratio lies between planner / best known and planner / the
    solver's lower bound."""
    got, best, bound = row["planner_inter_bytes"], row["optimum_inter_bytes"], row["optimum_lower_bound"]
    known = best if row["all_optimal"] else min(best, got)
    row["best_known_inter_bytes"] = known
    row["ratio"] = got / known if known > 0 else (1.0 if got == 0 else float("inf"))
    row["ratio_at_most"] = got / bound if bound > 0 else (1.0 if got == 0 else float("inf"))
    return row


def write(rows, args):
    rows = [complete(r) for r in rows]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "exchange_optimum.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        f"Inter-node payload bytes of balance::GlobalPlanner's steps (locality 0, node re-split over pairs and "
        f"triples) vs the exact minimum for the same samples per step ({args.solver}, "
        f"{'/'.join(sorted({r.get('model', 'node') for r in rows}))} model), {args.lws} ranks a node, "
        f"window {args.window}, queue {args.queue}, last of {args.rounds} rounds.",
        "",
        "| nodes | W | seed | steps | samples | planner inter-node B | exact minimum B | ratio planner / minimum |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["all_optimal"]:
            minimum, ratio = f"{r['optimum_inter_bytes']:.0f}", f"{r['ratio']:.3f}"
        else:
            minimum = (f"not proven in {args.tmlim} s/step: between {r['optimum_lower_bound']:.0f} and "
                       f"{r['best_known_inter_bytes']:.0f}")
            ratio = f"{r['ratio']:.3f} to {r['ratio_at_most']:.3f}"
        lines.append(f"| {r['nodes']} | {r['world']} | {r['seed']} | {r['steps']} | {r['samples']} | "
                     f"{r['planner_inter_bytes']:.0f} | {minimum} | {ratio} |")
    (out / "exchange_optimum.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
