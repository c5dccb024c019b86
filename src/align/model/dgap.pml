/*
 * DGAP: W daemons agree, round by round, how many steps each emits.
 * Model of src/align (LocalPlanner + Aligner), checked exhaustively by spin.
 *
 * Abstracted away (docs/alignment.md, "What the model abstracts"):
 *  - samples are counts, not lengths; FormGroups is "any group count G with
 *    1 <= G <= N" (every grouping of N samples has that many groups);
 *  - which groups are held back / split: a rank emitting T steps out of G
 *    groups emits any sample count the real planner could (see EMIT);
 *  - the all-gather is a shared array plus a barrier (Gloo's all-gather gives
 *    every rank the same W contributions, or fails everywhere);
 *  - time: wait expiry and trainer consumption are nondeterministic.
 *
 * Checked: no deadlock / invalid end state (every rank leaves the epoch at the
 * same round), the same T on every rank every round, split feasibility,
 * credit never exceeded, bounded termination after all streams end, and
 * coverage (Join: every received sample emitted once; Non-Join: emitted +
 * reported == received, same step count on all ranks).
 */
#ifndef W
#define W 2
#endif
#ifndef MAXS
#define MAXS 3      /* samples one rank may receive in the epoch */
#endif
#ifndef JOIN
#define JOIN 1      /* 1: Join mode, 0: Non-Join mode */
#endif
#define WIN 2       /* planner window and wait threshold */
#define DEPTH 2     /* emitter credit per rank */
#define MAXWAIT 1   /* max_wait_rounds */
#define BOUND (MAXS + 1)  /* rounds with credit after all streams finished */

/* The all-gather: what each rank contributed this round. */
byte g_pend[W];
bool g_fin[W];
byte g_free[W];
byte g_groups[W];
bool g_expired[W];

/* Each rank's own decision, compared after the round. */
byte T[W];
bool done[W];
int steps[W];

/* Ghost bookkeeping for the coverage assertions. */
byte recv[W];
byte emitted[W];
byte reported[W];

byte arrived = 0;
bool sense = false;
byte finished_ranks = 0;

inline barrier() {
  mysense = !mysense;
  atomic {
    arrived++;
    if
    :: arrived == W -> arrived = 0; sense = mysense
    :: else -> skip
    fi
  }
  (sense == mysense)
}

inline pick(v, lo, hi) {  /* v := any value in [lo, hi] */
  v = lo;
  do
  :: v < hi -> v++
  :: break
  od
}

proctype Rank(byte r) {
  byte pend = 0, queued = 0, wr = 0, after = 0;
  byte i, t, n, lo, hi, e, minfree, maxg, minn;
  bool fin = false, mysense = false, waiting, anydrained, alldrained, allfin, fin_epoch;

  do
  :: true ->
     /* Local work and reads of the gathered arrays between two barriers are
        atomic: no other rank writes what they read (sound reduction). */
     atomic {
     /* Between rounds: arrivals, end of stream, the trainer consumes. */
     if
     :: !fin && recv[r] < MAXS -> recv[r]++; pend++
     :: skip
     fi;
     if
     :: !fin -> fin = true
     :: skip
     fi;
     if
     :: queued > 0 -> queued--
     :: skip
     fi;

     /* Contribution to the all-gather. */
     g_pend[r] = pend;
     g_fin[r] = fin;
     g_free[r] = DEPTH - queued;
     n = (pend < WIN -> pend : WIN);
     if
     :: n == 0 -> g_groups[r] = 0
     :: n > 0 -> pick(g_groups[r], 1, n)
     fi;
     if
     :: g_expired[r] = true
     :: g_expired[r] = false
     fi
     };
     barrier();

     atomic {

     /* The planner, run by every rank on the same gathered state. */
     anydrained = false; alldrained = true; allfin = true; waiting = false;
     minfree = 255; maxg = 0; minn = 255;
     i = 0;
     do
     :: i < W ->
        if
        :: g_fin[i] && g_pend[i] == 0 -> anydrained = true
        :: else -> alldrained = false
        fi;
        allfin = allfin && g_fin[i];
        if
        :: !g_fin[i] && g_pend[i] < WIN && wr < MAXWAIT && !g_expired[i] -> waiting = true
        :: else -> skip
        fi;
        if
        :: g_free[i] < minfree -> minfree = g_free[i]
        :: else -> skip
        fi;
        if
        :: g_groups[i] > maxg -> maxg = g_groups[i]
        :: else -> skip
        fi;
        n = (g_pend[i] < WIN -> g_pend[i] : WIN);
        if
        :: n > 0 && n < minn -> minn = n
        :: else -> skip
        fi;
        i++
     :: else -> break
     od;
     t = 0; fin_epoch = false;
     if
     :: (JOIN == 0 && anydrained) || alldrained -> fin_epoch = true
     :: else ->
        if
        :: waiting || minfree == 0 || maxg == 0 -> t = 0
        :: else ->
           t = minfree;
           if :: maxg < t -> t = maxg :: else -> skip fi;
           if :: minn < t -> t = minn :: else -> skip fi
        fi
     fi;
     if
     :: waiting && !fin_epoch -> wr++
     :: else -> wr = 0
     fi;
     if
     :: allfin && minfree > 0 -> after++; assert(after <= BOUND)
     :: else -> skip
     fi;

     /* This rank's share of the plan: EMIT. */
     n = (pend < WIN -> pend : WIN);
     e = 0;
     if
     :: fin_epoch ->
        if
        :: JOIN == 1 -> assert(pend == 0)
        :: else -> reported[r] = pend
        fi
     :: !fin_epoch && t > 0 && n > 0 ->
        assert(n >= t);                 /* splitting can always reach T */
        if
        :: g_groups[r] >= t ->          /* keep T groups, hold the rest */
           lo = t; hi = n - (g_groups[r] - t);
           pick(e, lo, hi)
        :: else -> e = n               /* split: everything in the window goes */
        fi
     :: else -> skip                    /* T = 0, or IDLE steps only */
     fi;
     T[r] = t;
     done[r] = fin_epoch;
     /* Dead temporaries back to 0 so they do not multiply states. */
     i = 0; n = 0; lo = 0; hi = 0; minfree = 0; maxg = 0; minn = 0;
     anydrained = false; alldrained = false; allfin = false
     };
     barrier();

     atomic {
     /* Every rank decided the same. */
     i = 0;
     do
     :: i < W -> assert(T[i] == t && done[i] == fin_epoch); i++
     :: else -> break
     od;
     pend = pend - e;
     emitted[r] = emitted[r] + e;
     steps[r] = steps[r] + t;
     queued = queued + t;
     assert(queued <= DEPTH);
     i = 0; e = 0; t = 0;
     if
     :: !fin_epoch -> waiting = false
     :: else -> skip
     fi
     };
     if
     :: fin_epoch -> break
     :: else -> skip
     fi
  od;

  /* Coverage. */
  if
  :: JOIN == 1 -> assert(emitted[r] == recv[r] && pend == 0)
  :: else -> assert(emitted[r] + reported[r] == recv[r])
  fi;
  atomic {
    finished_ranks++;
    i = 0;
    do
    :: finished_ranks == W && i < W -> assert(steps[i] == steps[r]); i++
    :: else -> break
    od
  }
}

init {
  byte k = 0;
  atomic {
    do
    :: k < W -> run Rank(k); k++
    :: else -> break
    od
  }
}
