/*
 * Two models in one file (the sh_test ships this file only):
 *   default    DGAP rounds of LocalPlanner + Aligner (samples stay home);
 *   -DMOVE=1   the global planner: samples move between ranks, payloads are
 *              sent owner -> emitting rank and must arrive before the step.
 * run_spin.sh checks both.
 */
#ifndef MOVE
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
 *  - time: wait expiry and trainer consumption are nondeterministic; a rank
 *    that has received nothing yet waits past MAXWAIT until its expiry (the
 *    start wait), so its waits are bounded only by that nondeterministic
 *    expiry: safety is checked here, the bound by the unit tests.
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
bool g_started[W];   /* something of the epoch reached the rank (start wait) */

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
     g_started[r] = fin || recv[r] > 0;
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
        :: !g_fin[i] && g_pend[i] < WIN && (wr < MAXWAIT || !g_started[i]) && !g_expired[i] -> waiting = true
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
     :: waiting && !fin_epoch && wr < MAXWAIT -> wr++
     :: waiting && !fin_epoch && wr >= MAXWAIT -> skip  /* saturates: only compared with MAXWAIT */
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

#else  /* MOVE */

/*
 * DGAP with moving samples: the global planner (src/balance/global_planner)
 * may emit a sample owned by rank a on rank b; a's daemon then sends the
 * payload a -> b, and b may emit the step holding it only once it arrived.
 * Checked exhaustively by spin (run_spin.sh).
 *
 * Abstracted away (docs/alignment.md, "What the model abstracts"):
 *  - lengths, budgets and grouping: the planner forms any G in [1, |pool|]
 *    groups, T = min(min free, floor(G / W)) (ceil once every stream
 *    finished), and deals the pool to the T*W (step, rank) slots in ANY way
 *    the real rules allow: every slot gets a sample while the pool lasts
 *    (never an IDLE slot before every stream finished), the other samples go
 *    to any slot or stay pending (all of them go when every stream finished
 *    and the credit covers ceil(G / W)). Samples of one owner are
 *    interchangeable, so a slot is filled by choosing an owner;
 *  - the planner is one shared choice per round (the real one is a pure
 *    function of the gathered state, so every rank computes the same plan:
 *    the unit tests and dgap.pml check that part); bounded waits are left out
 *    (dgap.pml covers them, the rule is the same shared code);
 *  - the payload transport is one bounded FIFO channel per receiving rank
 *    (BUF messages), reliable unless a BUG_* switch says otherwise; every
 *    daemon runs an event loop that sends, receives and emits in any order
 *    that is enabled, never blocking on one of them;
 *  - time: arrivals, stream ends and trainer consumption are nondeterministic.
 *
 * Bug switches (run_spin.sh checks that each one is caught): BUG_WRONG_DST
 * (payload sent to the wrong rank), BUG_DROP (payload lost), BUG_DUP
 * (payload sent twice; needs BUF >= 2), BUG_NO_WAIT (a step emitted before
 * its payloads arrived).
 *
 * Checked: no deadlock / invalid end state; every payload arrives at the
 * rank that emits its sample and nowhere else; every sample emitted at most
 * once while the epoch runs, and at the end exactly once (Join) or emitted +
 * reported == received (Non-Join); IDLE slots only after every stream
 * finished; credit never exceeded; equal step counts; bounded termination
 * after all streams end; no payload left in a channel at the end.
 */
#ifndef W
#define W 2
#endif
#ifndef MAXS
#define MAXS 2      /* samples one rank may receive in the epoch */
#endif
#ifndef JOIN
#define JOIN 1      /* 1: Join mode, 0: Non-Join mode */
#endif
#ifndef BUF
#define BUF 1       /* payload channel capacity per receiving rank */
#endif
#define DEPTH 2     /* emitter credit per rank */
#define NS (W * MAXS)     /* sample s is the (s % MAXS)-th of owner s / MAXS */
#define BOUND (MAXS + 1)  /* rounds with credit after all streams finished */

/* Sample states. */
#define ABSENT 0
#define PENDING 1
#define PLANNED 2
#define EMITTED 3

/* Where a payload goes; BUG_WRONG_DST sends it to the wrong rank. */
#ifdef BUG_WRONG_DST
#define SEND_TO(s) ((dst[s] + 1) % W)
#else
#define SEND_TO(s) (dst[s])
#endif

/* The gathered metadata: sample states are global (every rank sees every
   rank's pending list after the all-gather). */
byte st[NS];
byte dst[NS];      /* PLANNED: rank that emits it */
byte stp[NS];      /* PLANNED: step of the round */
byte ecount[NS];   /* ghost: times emitted */
bool have[NS];     /* ghost: payload arrived at dst */
bool g_fin[W];
byte g_free[W];

/* The round's plan (shared: a pure function of the gathered state). */
byte p_t = 0;
bool p_done = false;
bool p_allfin = false;

int steps[W];
byte recv[W];
byte reported[W];

chan pay[W] = [BUF] of { byte };

byte arrived = 0;
bool sense = false;
byte finished_ranks = 0;
byte after = 0;    /* rounds with credit after every stream finished */

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

/* missing := payloads of step k planned on rank r that have not arrived. */
inline count_missing() {
  missing = 0; s = 0;
  do
  :: s < NS ->
     if
     :: st[s] == PLANNED && dst[s] == r && stp[s] == k && s / MAXS != r && !have[s] -> missing++
     :: else -> skip
     fi;
     s++
  :: else -> break
  od;
  s = 0
}

inline pick(v, lo, hi) {  /* v := any value in [lo, hi] */
  v = lo;
  do
  :: v < hi -> v++
  :: break
  od
}

/* The global planner, run once per round on the gathered state. */
inline plan() {
  anydrained = false; alldrained = true; allfin = true; minfree = 255; npool = 0;
  i = 0;
  do
  :: i < W ->
     n = 0;
     j = 0;
     do
     :: j < MAXS -> if :: st[i * MAXS + j] == PENDING -> n++ :: else -> skip fi; j++
     :: else -> break
     od;
     npool = npool + n;
     if
     :: g_fin[i] && n == 0 -> anydrained = true
     :: else -> alldrained = false
     fi;
     allfin = allfin && g_fin[i];
     if :: g_free[i] < minfree -> minfree = g_free[i] :: else -> skip fi;
     i++
  :: else -> break
  od;
  p_t = 0; p_done = false; p_allfin = allfin;
  if
  :: (JOIN == 0 && anydrained) || alldrained -> p_done = true
  :: else ->
     if
     :: minfree == 0 || npool == 0 -> skip
     :: else ->
        pick(g, 1, npool);
        if
        :: allfin -> p_t = (g + W - 1) / W
        :: else -> p_t = g / W
        fi;
        all_go = allfin && p_t <= minfree;
        if :: minfree < p_t -> p_t = minfree :: else -> skip fi
     fi
  fi;
  if
  :: allfin && minfree > 0 -> after++; assert(after <= BOUND)
  :: else -> skip
  fi;
  if
  :: p_t > 0 ->
     /* Every slot gets a sample while the pool lasts: choose its owner. */
     slot = 0;
     do
     :: slot < p_t * W && npool > 0 ->
        pick(o, 0, W - 1);
        k = 0;
        do  /* first owner from o on (cyclically) with an unplanned sample */
        :: k < W ->
           j = 0;
           do
           :: j < MAXS && st[((o + k) % W) * MAXS + j] != PENDING -> j++
           :: else -> break
           od;
           if :: j < MAXS -> break :: else -> k++ fi
        :: else -> break
        od;
        assert(k < W);
        s = ((o + k) % W) * MAXS + j;
        st[s] = PLANNED; dst[s] = slot % W; stp[s] = slot / W;
        npool--;
        slot++
     :: else -> break
     od;
     /* A slot may stay empty (IDLE) only once every stream finished. */
     assert(slot == p_t * W || allfin);
     /* The rest: any slot, or stay pending (not once everything must go). */
     s = 0;
     do
     :: s < NS ->
        if
        :: st[s] == PENDING ->
           if
           :: all_go -> pick(slot, 0, p_t * W - 1)
           :: else -> pick(slot, 0, p_t * W)
           fi;
           if
           :: slot < p_t * W -> st[s] = PLANNED; dst[s] = slot % W; stp[s] = slot / W
           :: else -> skip
           fi
        :: else -> skip
        fi;
        s++
     :: else -> break
     od
  :: else -> skip
  fi;
  i = 0; j = 0; k = 0; n = 0; o = 0; s = 0; g = 0; slot = 0; npool = 0; minfree = 0;
  anydrained = false; alldrained = false; allfin = false; all_go = false
}

proctype Rank(byte r) {
  byte queued = 0, t, k, nxt, m, i, j, n, o, s, g, slot, npool, minfree, own, missing;
  bool fin = false, mysense = false, idle, anydrained, alldrained, allfin, all_go;

  do
  :: true ->
     atomic {
     /* Between rounds: arrivals, end of stream, the trainer consumes. */
     if
     :: !fin && recv[r] < MAXS -> st[r * MAXS + recv[r]] = PENDING; recv[r]++
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
     g_fin[r] = fin;
     g_free[r] = DEPTH - queued
     };
     barrier();
     if
     :: r == 0 -> atomic { plan() }
     :: else -> skip
     fi;
     barrier();

     /* This rank's share: send the payloads of its samples planned
        elsewhere, receive the ones planned here, emit its p_t steps in
        order, each once all its payloads arrived. Any enabled action; the
        emit of step k is blocked (not polled) until `missing` is 0, so a
        payload that never comes shows up as a deadlock. */
     atomic { t = p_t; k = 0; nxt = 0; count_missing() };
     do
     :: atomic { nxt < NS && !(st[nxt] == PLANNED && nxt / MAXS == r && dst[nxt] != r) -> nxt++ }
     :: atomic { nxt < NS && st[nxt] == PLANNED && nxt / MAXS == r && dst[nxt] != r && nfull(pay[SEND_TO(nxt)]) ->
#ifndef BUG_DROP
        pay[SEND_TO(nxt)]!nxt;
#endif
#ifdef BUG_DUP
        if :: nfull(pay[SEND_TO(nxt)]) -> pay[SEND_TO(nxt)]!nxt :: else -> skip fi;
#endif
        nxt++ }
     :: atomic { nempty(pay[r]) -> pay[r]?m;
        /* Only payloads this rank emits, each once. */
        assert(st[m] == PLANNED && dst[m] == r && m / MAXS != r && !have[m]);
        have[m] = true;
        if :: stp[m] == k -> missing-- :: else -> skip fi;
        m = 0 }
#ifdef BUG_NO_WAIT
     :: atomic { k < t ->
#else
     :: atomic { k < t && missing == 0 ->
#endif
        idle = true; s = 0;
        do
        :: s < NS ->
           if
           :: st[s] == PLANNED && dst[s] == r && stp[s] == k ->
              assert(s / MAXS == r || have[s]);
              assert(ecount[s] == 0);
              ecount[s]++; st[s] = EMITTED; have[s] = false; idle = false
           :: else -> skip
           fi;
           s++
        :: else -> break
        od;
        assert(!idle || p_allfin);  /* IDLE slots only once every stream finished */
        k++;
        if :: k < t -> count_missing() :: else -> skip fi;
        s = 0; idle = false }
     :: atomic { nxt == NS && k == t -> break }
     od;

     atomic {
     steps[r] = steps[r] + t;
     queued = queued + t;
     assert(queued <= DEPTH);
     t = 0; k = 0; nxt = 0; missing = 0
     };
     /* No barrier needed here: the next plan is made only once every rank
        has reached the next round's first barrier. */
     if
     :: p_done -> break
     :: else -> skip
     fi
  od;

  /* Coverage of this rank's own samples, wherever they were emitted. */
  atomic {
  own = 0; s = r * MAXS;
  do
  :: s < r * MAXS + MAXS ->
     if
     :: st[s] == EMITTED -> assert(ecount[s] == 1); own++
     :: st[s] == PENDING -> assert(ecount[s] == 0 && JOIN == 0)
     :: else -> assert(st[s] == ABSENT && ecount[s] == 0)
     fi;
     s++
  :: else -> break
  od;
  if
  :: JOIN == 1 -> assert(own == recv[r])
  :: else -> reported[r] = recv[r] - own
  fi;
  finished_ranks++;
  if
  :: finished_ranks == W ->
     i = 0;
     do
     :: i < W -> assert(steps[i] == steps[r] && empty(pay[i])); i++
     :: else -> break
     od
  :: else -> skip
  fi
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

#endif  /* MOVE */
