#!/usr/bin/env python3
"""Issue 35's W = 8 mark, cell by cell, for every step model whose CSV is in the given directories: the windowed
fraction of the bound under (b) over the same run without windows (>= 0.98) with IDLE rank-steps <= 5%.
usage: marks.py DIR [DIR ...]   (each with win_<model>_w8[_uneq].csv from bench/window_sim_table.py; a later DIR's model
replaces an earlier one's)"""
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
                if r.get('uneq_per_window_bound_seconds'):
                    bound = float(r['bound_seconds' if packed else 'padded_bound_seconds'])
                    ceiling = bound / float(r['uneq_per_window_bound_seconds']) / none
                out[(model, target, 'packed' if packed else 'padded', r['trace'])] = dict(
                    ratio=b / none, idle=float(r['idle_share']), steps=int(r['steps']), ceiling=ceiling)
    return out


def main():
    cells = load(sys.argv[1:])
    ok = lambda x: x['ratio'] >= 0.98 and x['idle'] <= 0.05
    # A cell no schedule can bring within 2%: its ceiling for any counts is below 0.98 of the unwindowed fraction.
    out_of_reach = lambda x: x['ceiling'] is not None and x['ceiling'] < 0.98
    fmt = lambda x: '-' if x is None else f'{x:.4f}'
    print('| model | target | mode | trace | (b) / none | ceiling / none | IDLE | micro-steps | mark |')
    print('|---|---|---|---|---|---|---|---|---|')
    for k in sorted(cells):
        c = cells[k]
        mark = 'yes' if ok(c) else 'out of reach' if out_of_reach(c) else '**no**'
        print(f"| {' | '.join(k)} | {c['ratio']:.4f} | {fmt(c['ceiling'])} | {c['idle'] * 100:.1f}% | {c['steps']} "
              f"| {mark} |")
    print()
    print('| model | target | mode | traces with the mark | out of reach for any layout and counts |')
    print('|---|---|---|---|---|')
    for g in sorted({k[:3] for k in cells}):
        ks = [k for k in cells if k[:3] == g]
        print(f"| {' | '.join(g)} | {sum(ok(cells[k]) for k in ks)} of {len(ks)} "
              f"| {sum(out_of_reach(cells[k]) for k in ks)} |")
    n_ok = sum(ok(c) for c in cells.values())
    n_out = sum(out_of_reach(c) and not ok(c) for c in cells.values())
    print(f"\nall: {n_ok} of {len(cells)} cells have the mark; {n_out} are out of reach; "
          f"{len(cells) - n_ok - n_out} could have it and do not")


if __name__ == '__main__':
    main()
