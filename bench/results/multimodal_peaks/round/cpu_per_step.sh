#!/bin/bash
# CPU per step of the encoder planner (bazel-bin/bench/phase_replay --timing: the planner calls' thread CPU
# time, per step on average and the most one round (or step) took) at
# W = 4 (the six recent runs' steps, each run 20x in a row: 1800 steps) and W = 8 (two runs' ranks side
# by side per step: 900 steps), per rule. Run from the repository root after
# `nice -n 19 bazel build -c opt //bench:phase_replay`.
set -e
tmp=$(mktemp -d)
/usr/bin/python3 - "$tmp" <<'PY'
import json, sys
tmp = sys.argv[1]
runs = ["bench/results/multimodal_peaks/w4_s0.json", "bench/results/multimodal_peaks/w4_s1.json",
        "bench/results/multimodal_peaks/w4_s2.json", "bench/results/multimodal_peaks/trim/w4_s0.json",
        "bench/results/multimodal_peaks/trim/w4_s1.json", "bench/results/multimodal_peaks/trim/w4_s2.json"]
per = [json.load(open(r))["raw"]["odb_phases_packed"] for r in runs]
def rank(r, k, w):
    s = r["records"][k].get("samples") if k < len(r["records"]) else None
    return f"@{w} " + " ".join(",".join(map(str, x)) for x in s) if s else None
def line(parts): return " | ".join(p for p in parts if p) + "\n"
with open(f"{tmp}/w4.txt", "w") as f:
    for _ in range(20):
        for p in per:
            for k in range(max(len(r["records"]) for r in p)):
                f.write(line(rank(p[w], k, w) for w in range(4)))
with open(f"{tmp}/w8.txt", "w") as f:
    for _ in range(20):
        for a, b in ((0, 3), (1, 4), (2, 5)):
            for k in range(min(max(len(r["records"]) for r in per[a]), max(len(r["records"]) for r in per[b]))):
                f.write(line([rank(per[a][w], k, w) for w in range(4)] +
                             [rank(per[b][w], k, w + 4) for w in range(4)]))
PY
/usr/bin/python3 -c "
import sys, yaml; sys.path.insert(0, 'examples'); import multimodal_train as mt, argparse
a = argparse.Namespace(max_tokens=1024, seed=0, phase_costs=None, llm_step_time=None, memory_plan=True, phase_steps=True)
yaml.safe_dump(mt.daemon_config(a, True, 0, True), open('$tmp/odbd.yaml', 'w'))"
for w in 4 8; do
  n=$(wc -l < "$tmp/w$w.txt")
  for rule in "forecast (default)|" "run so far|--run-so-far-peaks" "no ratio|--memory-peak-ratio 0" \
              "round joint, R=15|--round-joint --round-steps 15" "round joint, R=4|--round-joint --round-steps 4" "round joint, R=32|--round-joint --round-steps 32"; do
    flags=${rule#*|}
    echo "W=$w ${rule%%|*}: $(bazel-bin/bench/phase_replay --config "$tmp/odbd.yaml" --steps "$tmp/w$w.txt" $flags --timing 2>&1 > /dev/null)"
  done
done
rm -r "$tmp"
