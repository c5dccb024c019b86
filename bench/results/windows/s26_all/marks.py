#!/usr/bin/env python3
"""Issue 35's W = 8 mark, cell by cell, for every step model whose CSV is in the given directories: the windowed
fraction of the bound under (b) over the same run without windows (>= 0.98) with IDLE rank-steps <= 5%.
usage: marks.py DIR [DIR ...]   (each with win_<model>_w8[_uneq].csv from bench/window_sim_table.py; a later DIR's model
replaces an earlier one's). A cell is out of reach when its per-window ceiling for any counts
(uneq_per_window_bound_seconds) or, where the CSV has it, for equal counts (uneq_equal_counts_bound_seconds,
bench/window_bound.h: the daemon's equal micro-step counts per rank) is below 0.98 of the unwindowed fraction."""
import csv, glob, sys

TARGETS = {'32768': '1m', '131072': '4m', '524288': '16m'}


def load(dirs):
    out = {}
    for d in dirs:
        for path in sorted(glob.glob(f'{d}/win_*_w8*.csv')):
            rows = list(csv.DictReader(open(path)))
            model = rows[0]['model']
            out = {k: v for k, v in out.items() if k[0] != model}
            base = {(r['trace'], r['policy']): r for r in rows if r['window_tokens'] == '0'}
            for r in rows:
                if r['window_tokens'] == '0':
                    continue
                packed = 'packed' in r['policy']
                none = float(base[(r['trace'], r['policy'])]['of_bound' if packed else 'of_padded_bound'])
                b = float(r['of_bound_window' if packed else 'of_padded_bound_window'])
                target = TARGETS.get(r['window_tokens'], r['window_tokens'])
                ceiling = None  # the per-window bound for any counts (--unequal-microsteps), over the unwindowed
                equal = None  # the same for equal counts (s26_ceil on)
                bound = float(r['bound_seconds' if packed else 'padded_bound_seconds'])
                if r.get('uneq_per_window_bound_seconds'):
                    ceiling = bound / float(r['uneq_per_window_bound_seconds']) / none
                if r.get('uneq_equal_counts_bound_seconds'):
                    equal = bound / float(r['uneq_equal_counts_bound_seconds']) / none
                out[(model, target, 'packed' if packed else 'padded', r['trace'])] = dict(
                    ratio=b / none, idle=float(r['idle_share']), steps=int(r['steps']), ceiling=ceiling,
                    equal=equal)
    return out


def main():
    cells = load(sys.argv[1:])
    for k, c in cells.items():  # a ceiling is a bound: the schedule as planned never beats it
        if c['equal'] is not None and c['ratio'] > c['equal'] * (1 + 1e-9):
            print(f"marks.py: {k}: (b) / none {c['ratio']} above its equal-counts ceiling {c['equal']}", file=sys.stderr)
            sys.exit(1)
    ok = lambda x: x['ratio'] >= 0.98 and x['idle'] <= 0.05
    # A cell no schedule can bring within 2%: its ceiling for any counts is below 0.98 of the unwindowed fraction.
    out_of_reach = lambda x: x['ceiling'] is not None and x['ceiling'] < 0.98
    # No layout with equal counts per rank (the daemon's) gets there either: its ceiling for equal counts.
    out_of_reach_eq = lambda x: x['equal'] is not None and x['equal'] < 0.98
    fmt = lambda x: '-' if x is None else f'{x:.4f}'
    print('| model | target | mode | trace | (b) / none | ceiling / none, any counts | ceiling / none, equal counts '
          '| IDLE | micro-steps | mark |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for k in sorted(cells):
        c = cells[k]
        mark = ('yes' if ok(c) else 'out of reach' if out_of_reach(c)
                else 'out of reach, equal counts' if out_of_reach_eq(c) else '**no**')
        print(f"| {' | '.join(k)} | {c['ratio']:.4f} | {fmt(c['ceiling'])} | {fmt(c['equal'])} "
              f"| {c['idle'] * 100:.1f}% | {c['steps']} | {mark} |")
    print()
    print('| model | target | mode | traces with the mark | out of reach for any layout and counts '
          '| out of reach with equal counts only |')
    print('|---|---|---|---|---|---|')
    for g in sorted({k[:3] for k in cells}):
        ks = [k for k in cells if k[:3] == g]
        print(f"| {' | '.join(g)} | {sum(ok(cells[k]) for k in ks)} of {len(ks)} "
              f"| {sum(out_of_reach(cells[k]) for k in ks)} "
              f"| {sum(out_of_reach_eq(cells[k]) and not out_of_reach(cells[k]) for k in ks)} |")
    n_ok = sum(ok(c) for c in cells.values())
    n_out = sum(out_of_reach(c) and not ok(c) for c in cells.values())
    n_eq = sum(out_of_reach_eq(c) and not out_of_reach(c) and not ok(c) for c in cells.values())
    print(f"\nall: {n_ok} of {len(cells)} cells have the mark; {n_out} are out of reach for any counts, {n_eq} more "
          f"with equal counts; {len(cells) - n_ok - n_out - n_eq} could have it and do not")


if __name__ == '__main__':
    main()
