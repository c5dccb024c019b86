#!/bin/bash
# Whole-job vs partitioned planner CPU (thread CPU, the real GlobalPlanner), 3 repeats each.
B=${B:-$(git rev-parse --show-toplevel)/bazel-bin/bench/scale_bench}
for W in 128 256 384 512 1024; do
  for P in 0 64 128 192 256; do
    [ $P -ge $W ] && continue
    R=6; [ $W -ge 512 ] && R=3
    for rep in 1 2 3; do nice -n 5 $B --world $W --rounds $R --partition-ranks $P > r_w${W}_p${P}_$rep.json 2>/dev/null; done
  done
done
