#!/bin/bash
# The 15 recorded W = 4 runs replayed per rule (bench/phase_replay.py; "daemon" = configs/multimodal_train.yaml:
# memory_peak_ratio 1.09, per-step forecast). Run from the repository root after
# `nice -n 19 bazel build -c opt //bench:phase_replay`. The runs do not record their rounds: "joint RK" groups
# K consecutive recorded steps into one round (R15 = the run's 15 recorded steps as one round).
R="bench/results/multimodal_peaks/w4_s0.json bench/results/multimodal_peaks/w4_s1.json
   bench/results/multimodal_peaks/w4_s2.json bench/results/multimodal_peaks/trim/w4_s0.json
   bench/results/multimodal_peaks/trim/w4_s1.json bench/results/multimodal_peaks/trim/w4_s2.json
   bench/results/multimodal_compose/w4_s0.json bench/results/multimodal_compose/w4_s1.json
   bench/results/multimodal_compose/w4_s2.json bench/results/multimodal_compose/w4_s0_uncomposed.json
   bench/results/multimodal_compose/w4_s1_uncomposed.json bench/results/multimodal_compose/w4_s2_uncomposed.json
   bench/results/multimodal_replay/w4_s0.json bench/results/multimodal_replay/w4_s1.json
   bench/results/multimodal_replay/w4_s2.json"
V=(--variant "before=--run-so-far-peaks" --variant "no ratio=--memory-peak-ratio 0"
   --variant "margin 10=--memory-peak-ratio 0 --memory-cap-margin 10")
for k in ${ROUNDS:-15 12 10 8 6 5 4 3 2 1}; do V+=(--variant "joint R$k=--round-joint --round-steps $k"); done
for k in ${ROUNDS_M1:-15 8 4}; do  # and with memory_cap_margin 1 (the config: 0.3)
  V+=(--variant "joint R$k m1=--round-joint --round-steps $k --memory-cap-margin 1")
done
V+=(--variant "daemon m1=--memory-cap-margin 1")
nice -n 19 /usr/bin/python3 bench/phase_replay.py $R --targets "${V[@]}" "$@"
