"""Combines recorded multimodal runs (examples/multimodal_train.py --json) and a bench/phase_sim
output into bench/results/multimodal.json and a Markdown table beside it.

Run:
  /usr/bin/python3 examples/multimodal_train.py --world-size 2 --json /tmp/mm/w2.json
  /usr/bin/python3 examples/multimodal_train.py --world-size 4 --json /tmp/mm/w4.json
  $BIN/bench/phase_sim --trace bench/phase_trace_debian.txt --vision-cost ... > /tmp/mm/sim.json
  /usr/bin/python3 bench/phase_report.py --runs /tmp/mm/w2.json,/tmp/mm/w4.json --sim /tmp/mm/sim.json \\
      --out bench/results/multimodal
A run given as a.json+b.json merges files of one W and seed (methods run separately); runs labelled
"<prefix>seed N" of the same W and prefix get a seeds table (median and range); --previous keeps an earlier results
file's runs and simulator output.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

PHASES = ("vision", "audio", "llm")


def method_row(world: str, name: str, s: Dict[str, Any]) -> str:
    mm, bf = s["max_over_mean"], s["bound_fraction"]
    peak = max(s["peak_mem_mb"] or [0.0])
    keys = ("speedup_over_llm_only", "speedup_over_standard", "speedup_over_standard_packed")
    speed = " / ".join(f"{s[k]:.2f}x" for k in keys if k in s)
    modelled = " / ".join(f"{s['modelled_' + k]:.2f}x" for k in keys if "modelled_" + k in s)
    if modelled:
        speed += f" (modelled: {modelled})"
    return (f"| {world} | {name} | {s['sync_time_s']:.1f} | "
            + " | ".join(f"{mm[p]:.3f}" for p in PHASES)
            + " | " + " / ".join(f"{bf[p]:.2f}" for p in PHASES)
            + (" (" + " / ".join(f"{s['modelled_bound_fraction'][p]:.2f}" for p in PHASES) + ")"
               if s.get("modelled_bound_fraction") else "")
            + f" | {100 * s['encoder_share']:.0f}% | {peak:.1f} ({s['peak_mem_max_over_mean'] or 0:.2f}) "
            + (f"| {max(s['act_peak_mb']):.1f} ({s['act_peak_max_over_mean']:.2f}, {s['act_peak_over_bound']:.2f}) "
               if s.get("act_peak_over_bound") else "|  ")
            + f"| {s['real_tokens_per_s']:.0f} | {s['patches_per_s']:.0f} | {s['wall_s']:.0f} "
            f"| {s['optimizer_steps']} | {s['heldout_loss']:.4f} | {speed} |")


def markdown(runs: List[Dict[str, Any]], sim: Dict[str, Any] | None) -> str:
    lines = ["# Multimodal ablation: per-phase balancing (examples/multimodal_train.py)", "",
             "Columns: synchronous step time (s, the run's sum over steps of each phase's slowest rank, "
             "thread CPU time); max/mean over ranks of each phase's run total (vision, audio, LLM); each "
             "phase's bound fraction (sum of per-step bounds max(largest item, mean) / sum of the slowest "
             "rank; in parentheses the same for the run's plans under the fitted costs, free of measurement noise); the encoders' share of the compute; peak memory above the rank's post-warm-up level "
             "(MB, max over ranks, and max/mean; runs from 2026-12-06 on a CPU: the largest step's VmHWM above "
             "the step's start, glibc's thresholds fixed, examples/multimodal_train.py step_memory_kb); loss tokens/s and patches/s (wall clock); wall seconds; "
             "optimizer steps; held-out loss; for odb_phases (odb_phases_packed) its speedup in synchronous step "
             "time over odb_llm (odb_llm_packed) / standard / standard_packed (modelled: the same ratios of the "
             "runs' actual plans under the fitted costs, free of per-step measurement noise; a padded LLM on "
             "the fit of the padded odb steps, a packed one on the fit of the packed methods' steps). Methods "
             "ending in _packed run the LLM padding-free (attention per sample); standard, odb_llm and "
             "odb_phases pad it. Rows recorded before 2026-12-05 14:00 UTC kept their figures as recorded: "
             "modelled with one unpadded LLM fit over every method but Standard.", "",
             "Activation MB: the largest per-step activation memory of a rank (the bytes autograd saves for "
             "the backward, all phases of the step; deterministic, unlike VmHWM), max over ranks, with max/mean "
             "over ranks and max over the bound (the largest over steps of max(mean over ranks, the largest "
             "single item)).", "",
             "| W (run) | method | sync s | vision m/m | audio m/m | LLM m/m | bound v/a/l | enc | peak MB (m/m) "
             "| activation MB (m/m, /bound) | tok/s | patch/s | wall s | opt steps | held-out | speedup |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for name, s in run["methods"].items():
            if not name.startswith("_"):
                lines.append(method_row(f"{run['world_size']} ({run.get('label', '')})", name, s))
    lines += ["", "Fitted per-phase costs (seconds; per_step, per_item, per_unit, per_unit_sq):", ""]
    for run in runs:
        fits = run["methods"]["_fitted_phase_costs"]
        lines.append(f"* W = {run['world_size']} ({run.get('label', '')}): " + "; ".join(
            f"{p} " + ", ".join(f"{v:.3g}" for v in fits[p].values()) for p in PHASES))
    lines += seed_rows(runs)
    if sim:
        lines += ["", f"## Simulator (bench/phase_sim, {sim['trace']}, {sim['samples']} samples, "
                      f"{sim['batch']} per rank and step)", "",
                  "| W | policy | sync time | vision / audio / LLM bound fraction | sync bound fraction | "
                  "speedups of odb_phases |", "|---|---|---|---|---|---|"]
        for r in sim["results"]:
            sp = " / ".join(f"{k[len('speedup_over_'):]} {v:.2f}x" for k, v in r.items()
                            if k.startswith("speedup_over_"))
            lines.append(f"| {r['world']} | {r['policy']} | {r['sync_time']:.1f} | {r['vision_bound_fraction']:.3f}"
                         f" / {r['audio_bound_fraction']:.3f} / {r['llm_bound_fraction']:.3f} | "
                         f"{r['sync_bound_fraction']:.3f} | {sp} |")
    return "\n".join(lines) + "\n"


def merge_runs(paths: List[str]) -> Dict[str, Any]:
    """One run from several --json files of the same W and seed (methods run separately): their
    per-step records together, a later file's method replacing an earlier one's."""
    run = json.loads(Path(paths[0]).read_text())
    for path in paths[1:]:
        more = json.loads(Path(path).read_text())
        assert more["world_size"] == run["world_size"], (path, "another world size")
        run["raw"].update(more["raw"])
    return run


def seed_rows(runs: List[Dict[str, Any]]) -> List[str]:
    """Per W with several seeds: each seed's odb_phases speedups and every method's held-out loss,
    then median and range (the spread the targets are judged against)."""
    lines: List[str] = []
    by_world: Dict[Tuple[int, str], List[Dict[str, Any]]] = {}
    for run in runs:  # labels "<prefix>seed N": one table per W and prefix
        match = re.fullmatch(r"(.*?)seed \d+", run.get("label", ""))
        if match:
            by_world.setdefault((run["world_size"], match.group(1)), []).append(run)
    for (world, prefix), group in sorted(by_world.items()):
        if len(group) < 2:
            continue
        lines += ["", f"### W = {world}, {len(group)} seeds{' (' + prefix.strip(' :,') + ')' if prefix else ''}", "",
                  "| figure | " + " | ".join(r["label"] for r in group) + " | median | min-max |",
                  "|---|" + "---|" * (len(group) + 2)]
        figures = []
        for ph, llm_only in (("odb_phases", "odb_llm"), ("odb_phases_packed", "odb_llm_packed")):
            figures += [(f"{ph} / {llm_only} (sync)", ph, "speedup_over_llm_only"),
                        (f"{ph} / {llm_only} (modelled)", ph, "modelled_speedup_over_llm_only"),
                        (f"{ph} / standard (sync)", ph, "speedup_over_standard"),
                        (f"{ph} / standard (modelled, padded fit for a padded LLM)", ph,
                         "modelled_speedup_over_standard"),
                        (f"{ph} / standard_packed (sync)", ph, "speedup_over_standard_packed"),
                        (f"{ph} / standard_packed (modelled)", ph, "modelled_speedup_over_standard_packed"),
                        (f"{ph} activation max/mean", ph, "act_peak_max_over_mean"),
                        (f"{ph} activation peak/bound", ph, "act_peak_over_bound")]
            figures += [(f"{ph} bound fraction {p} (modelled)", ph, ("modelled_bound_fraction", p)) for p in PHASES]
        figures += [(f"{m} CPU measured / modelled", m, "measured_over_modelled")
                    for m in ("standard_packed", "odb_llm_packed", "odb_phases_packed")]
        figures += [(f"held-out {m}", m, "heldout_loss") for m in ("standard", "standard_packed", "odb_llm",
                                                                   "odb_phases", "odb_llm_packed",
                                                                   "odb_phases_packed")]
        for name, method, key in figures:
            vals = [(r["methods"].get(method, {}).get(key[0]) or {}).get(key[1]) if isinstance(key, tuple)
                    else r["methods"].get(method, {}).get(key) for r in group]
            got = sorted(v for v in vals if v is not None)
            if not got:
                continue
            cells = " | ".join(f"{v:.4g}" if v is not None else "" for v in vals)
            lines.append(f"| {name} | {cells} | {got[len(got) // 2]:.4g} | {got[0]:.4g}-{got[-1]:.4g} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True, help="comma list of multimodal_train.py --json files")
    p.add_argument("--labels", default="", help="comma list, one label per run (e.g. the cost model used)")
    p.add_argument("--sim", default=None, help="bench/phase_sim output (JSON)")
    p.add_argument("--out", required=True, help="path without suffix: writes .json and .md")
    p.add_argument("--previous", default=None,
                   help="an earlier bench/results/multimodal.json: its runs come first (as recorded), and its "
                        "simulator output unless --sim is given")
    p.add_argument("--runs-only", action="store_true", help="leave the earlier runs out (keep its simulator)")
    args = p.parse_args()
    runs = [merge_runs(item.split("+")) for item in args.runs.split(",") if item]
    for run, label in zip(runs, args.labels.split(",")):
        run["label"] = label
        if "raw" in run:  # recompute with the current summary code (e.g. the modelled sync time)
            import multimodal_train

            run["methods"] = multimodal_train.report({"results": run["raw"]}, run["world_size"])
        run.pop("raw", None)  # the per-step records stay in the run's own file
    sim = json.loads(Path(args.sim).read_text()) if args.sim else None
    if args.previous:
        previous = json.loads(Path(args.previous).read_text())
        if not args.runs_only:
            runs = previous["runs"] + runs
        sim = sim or previous.get("simulator")
    Path(args.out + ".json").write_text(json.dumps({"runs": runs, "simulator": sim}, indent=1) + "\n")
    Path(args.out + ".md").write_text(markdown(runs, sim))


if __name__ == "__main__":
    main()
