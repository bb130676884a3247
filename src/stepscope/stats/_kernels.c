/* stepscope fused CPU kernels: one pass per tensor, no temporaries.
 *
 * spine_*: writes 15 doubles in SPINE_FIELDS order
 *   total, finite, zero, negative, nan, posinf, neginf, min, max, absmax, sum, sum_squares,
 *   sum_abs, mean, m2
 * Moments are accumulated in double around a shift K (the first finite element) so that
 * m2 = sum(d^2) - sum(d)^2 / n suffers no cancellation from a large mean.
 *
 * hist_*: adds exact counts into a row of width W laid out as
 *   [negative bins (nb), positive bins (nb), zero, underflow_pos, underflow_neg, overflow_pos,
 *    overflow_neg, nan, posinf, neginf]
 * The bin is the float's binary exponent (via a table indexed by sign+exponent) plus the number of
 * exact integer mantissa thresholds the mantissa reaches. No log2, no rounding. Large float32
 * tensors on grids of <= 4 bins per octave count (sign, exponent, mantissa class) keys instead
 * and map them to slots once per call (hist_keys_f32): the same counts, about twice as fast.
 *
 * Portability: built at install time with portable flags (never -march=native); on
 * x86-64 Linux with GCC the hot loops are compiled three times with target_clones (x86-64-v4 =
 * AVX-512 + FMA, x86-64-v3 = AVX2 + FMA, and baseline x86-64; AVX-512F/AVX2 before GCC 12) and the
 * loader picks one at run time (ifunc). `#pragma omp simd` needs only -fopenmp-simd: no OpenMP
 * runtime is linked (torch ships its own; two runtimes in one process clash). Threads, when asked
 * for, are plain pthreads. No allocation is left unchecked: a failed one falls back to one thread.
 * Accuracy: every sum accumulates in float64 (float32 inputs widen exactly; 16 independent
 * accumulators per sum in a fixed order, a multiply-add fused where the clone has FMA, which only
 * removes a rounding), so each sum's error is at most n * 2**-52 times the sum of its terms' magnitudes
 * (sum(|x|); sum(x^2) for sum_squares: the float64 recursive-summation bound); tests check it
 * against math.fsum on adversarial inputs. Counts, min and max are exact.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(STEPSCOPE_NO_CLONES)
#define SS_DISPATCH 1
#if __GNUC__ >= 12 /* x86-64-v4: AVX-512F/BW/CD/DQ/VL + FMA; x86-64-v3: AVX2 + FMA */
#define SS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define SS_LEVELS 1
#else
#define SS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#else
#define SS_CLONES
#endif
#define SS_MAX_THREADS 64
#define SS_PAR_MIN 262144 /* below this, one thread: spawning costs more than it saves */

typedef struct {
    int64_t zero, neg, nan, pinf, ninf;
    double sd, sd2, sq, sa, mn, mx;
} part_t;

static void part_init(part_t *p) {
    memset(p, 0, sizeof(*p));
    p->mn = INFINITY;
    p->mx = -INFINITY;
}

static void part_add(part_t *a, const part_t *b) {
    a->zero += b->zero; a->neg += b->neg; a->nan += b->nan; a->pinf += b->pinf; a->ninf += b->ninf;
    a->sd += b->sd; a->sd2 += b->sd2; a->sq += b->sq; a->sa += b->sa;
    if (b->mn < a->mn) a->mn = b->mn;
    if (b->mx > a->mx) a->mx = b->mx;
}

static void finish(const part_t *p, int64_t n, double K, double *out) {
    int64_t fin = n - p->nan - p->pinf - p->ninf;
    out[0] = (double)n; out[1] = (double)fin; out[2] = (double)p->zero; out[3] = (double)p->neg;
    out[4] = (double)p->nan; out[5] = (double)p->pinf; out[6] = (double)p->ninf;
    if (fin > 0) {
        double sum = K * (double)fin + p->sd;
        double mean = K + p->sd / (double)fin;
        double m2 = p->sd2 - p->sd * p->sd / (double)fin;
        if (m2 < 0) m2 = 0;  /* round-off only: d^2 sums are non-negative */
        out[7] = p->mn; out[8] = p->mx;
        out[9] = fabs(p->mn) > fabs(p->mx) ? fabs(p->mn) : fabs(p->mx);
        out[10] = sum; out[11] = p->sq; out[12] = p->sa; out[13] = mean; out[14] = m2;
    } else {
        for (int i = 7; i < 15; i++) out[i] = NAN;
        out[10] = 0.0; out[11] = 0.0; out[12] = 0.0;  /* empty sums are exactly zero */
    }
}

/* Branch-free body (bit selects instead of ternaries) so that GCC vectorizes the whole loop. */
#define SPINE_RANGE(NAME, T, U, ABSMASK, EXPMASK, SIGNSHIFT)                                   \
    SS_CLONES static void NAME##_block(const T *restrict x, int64_t lo, int64_t hi, double K, part_t *p) { \
        /* int32 counters vectorize well; blocks are < 2**31 elements */                      \
        int32_t zero = 0, neg = 0, nan_ = 0, pinf = 0, ninf = 0;                              \
        double sd = 0, sd2 = 0, sq = 0, sa = 0;                                               \
        T mn = INFINITY, mx = -INFINITY;                                                      \
        const U signbit = (U)1 << SIGNSHIFT;                                                  \
        /* no `omp simd reduction` here: it licenses reassociating the float sums, and GCC then \
         * vectorized two inlined copies of this loop differently on x86-64-v3 (different bits \
         * on the fused and the per-tensor paths). Blocks holding a non-finite value and the   \
         * last < SS_LANES elements come here: summed in element order, on every clone. */     \
        for (int64_t i = lo; i < hi; i++) {                                                   \
            U u;                                                                              \
            memcpy(&u, &x[i], sizeof(u));                                                     \
            U a = u & ABSMASK;                                                                \
            U finm = -(U)(a < EXPMASK); /* all ones when finite */                            \
            int32_t isinf_ = a == EXPMASK;                                                    \
            int32_t s = (int32_t)(u >> SIGNSHIFT);                                            \
            zero += (a == 0);                                                                 \
            neg += (int32_t)(finm & 1) & s & (a != 0);                                        \
            nan_ += (a > EXPMASK);                                                            \
            pinf += isinf_ & (s ^ 1);                                                         \
            ninf += isinf_ & s;                                                               \
            U wb = u & finm, ab = a & finm;                                                   \
            U lb = wb | (EXPMASK & ~finm), hb = wb | ((EXPMASK | signbit) & ~finm);           \
            T w, av, l, h;                                                                    \
            memcpy(&w, &wb, sizeof(w));                                                       \
            memcpy(&av, &ab, sizeof(av));                                                     \
            memcpy(&l, &lb, sizeof(l));                                                       \
            memcpy(&h, &hb, sizeof(h));                                                       \
            double wd = (double)w;                                                            \
            double d = wd - K * (double)(finm & 1);                                           \
            sd += d;                                                                          \
            sd2 += d * d;                                                                     \
            sq += wd * wd;                                                                    \
            sa += (double)av;                                                                 \
            mn = l < mn ? l : mn;                                                             \
            mx = h > mx ? h : mx;                                                             \
        }                                                                                     \
        p->zero += zero; p->neg += neg; p->nan += nan_; p->pinf += pinf; p->ninf += ninf;     \
        p->sd += sd; p->sd2 += sd2; p->sq += sq; p->sa += sa;                                 \
        if ((double)mn < p->mn) p->mn = (double)mn;                                           \
        if ((double)mx > p->mx) p->mx = (double)mx;                                           \
    }                                                                                         \
    static void NAME##_acc(const T *restrict x, int64_t lo, int64_t hi, double K, part_t *p); \
    static void NAME(const T *restrict x, int64_t lo, int64_t hi, double K, part_t *p) {      \
        part_init(p);                                                                         \
        NAME##_acc(x, lo, hi, K, p);                                                          \
    }                                                                                         \
    static void NAME##_acc(const T *restrict x, int64_t lo, int64_t hi, double K, part_t *p) { \
        int64_t i = lo;                                                                       \
        for (;;) { /* fast blocks; a block holding a non-finite value is redone exactly */    \
            int64_t len = hi - i < SS_BLOCK ? (hi - i) / SS_LANES * SS_LANES : SS_BLOCK;       \
            if (len == 0) break;                                                              \
            if (!NAME##_fast(x + i, len, K, p)) NAME##_block(x, i, i + len, K, p);            \
            i += len;                                                                         \
        }                                                                                     \
        if (i < hi) NAME##_block(x, i, hi, K, p); /* the last < SS_LANES elements */          \
    }

/* The fast path: one block of SS_BLOCK (or a multiple of SS_LANES) elements, SS_LANES independent
 * float64 accumulators per sum (so the adds pipeline instead of waiting on one register), no
 * masks: it assumes every element is finite, and then computes exactly what the masked loop
 * would. A NaN or an infinity makes the block's sum of |x| non-finite, and that sends the block
 * to the masked loop above (still in L1); so does, harmlessly, a float64 block whose sum of |x|
 * overflows (the masked loop gives the same numbers). */
#define SS_LANES 16
#define SS_BLOCK 2048
#define SPINE_FAST(NAME, T)                                                                   \
    SS_CLONES static int NAME(const T *restrict x, int64_t n, double K, part_t *p) {          \
        double sd[SS_LANES], sd2[SS_LANES], sq[SS_LANES], sa[SS_LANES];                       \
        T mn[SS_LANES], mx[SS_LANES];                                                         \
        int32_t zero[SS_LANES], neg[SS_LANES];                                                \
        for (int j = 0; j < SS_LANES; j++) {                                                  \
            sd[j] = sd2[j] = sq[j] = sa[j] = 0.0;                                             \
            mn[j] = INFINITY; mx[j] = -INFINITY; zero[j] = neg[j] = 0;                        \
        }                                                                                     \
        for (int64_t i = 0; i < n; i += SS_LANES) {                                           \
            for (int j = 0; j < SS_LANES; j++) {                                              \
                T v = x[i + j];                                                               \
                double w = (double)v, d = w - K;                                              \
                sd[j] += d;                                                                   \
                sd2[j] += d * d;                                                              \
                sq[j] += w * w;                                                               \
                sa[j] += fabs(w);                                                             \
                mn[j] = v < mn[j] ? v : mn[j];                                                \
                mx[j] = v > mx[j] ? v : mx[j];                                                \
                zero[j] = v == 0 ? zero[j] + 1 : zero[j];                                     \
                neg[j] = v < 0 ? neg[j] + 1 : neg[j];                                         \
            }                                                                                 \
        }                                                                                     \
        double a = 0.0, b = 0.0, c = 0.0, e = 0.0, lo = INFINITY, hi = -INFINITY;            \
        int64_t z = 0, ng = 0;                                                                \
        for (int j = 0; j < SS_LANES; j++) {                                                  \
            a += sd[j]; b += sd2[j]; c += sq[j]; e += sa[j]; z += zero[j]; ng += neg[j];       \
            lo = (double)mn[j] < lo ? (double)mn[j] : lo;                                     \
            hi = (double)mx[j] > hi ? (double)mx[j] : hi;                                     \
        }                                                                                     \
        if (!isfinite(e)) return 0; /* a NaN or an infinity in the block */                \
        p->sd += a; p->sd2 += b; p->sq += c; p->sa += e; p->zero += z; p->neg += ng;          \
        if (lo < p->mn) p->mn = lo;                                                           \
        if (hi > p->mx) p->mx = hi;                                                           \
        return 1;                                                                             \
    }

/* FMA contraction inside the spine loops only (the clones that have FMA fuse d*d + acc; the
 * merge below stays uncontracted, bit for bit numpy): a fused multiply-add rounds once, so the
 * sums are at least as accurate as with separate operations, and the spine runs ~15% faster
 * than uncontracted (benchmarks/kernels.py --against). So the x86-64-v4 and x86-64-v3 clones
 * give the same bits (fixed lanes, the same fused operations), and the baseline clone differs
 * from them only within the documented float64 bound; tests/stats/test_isa_levels.py checks
 * both on every level this CPU has. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")
#endif
SPINE_FAST(spine_range_f32_fast, float)
SPINE_FAST(spine_range_f64_fast, double)
SPINE_RANGE(spine_range_f32, float, uint32_t, 0x7fffffffu, 0x7f800000u, 31)
SPINE_RANGE(spine_range_f64, double, uint64_t, 0x7fffffffffffffffull, 0x7ff0000000000000ull, 63)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

/* Runs fn over [0, n) split into nthreads contiguous ranges; the calling thread takes range 0 and
 * a thread that cannot be created runs its range inline (results never depend on thread counts
 * for counts; float sums differ only by summation order). */
typedef void (*range_fn)(void *ctx, int64_t lo, int64_t hi, int t);
typedef struct {
    range_fn fn;
    void *ctx;
    int64_t lo, hi;
    int t;
} job_t;

static void *job_run(void *p) {
    job_t *j = (job_t *)p;
    j->fn(j->ctx, j->lo, j->hi, j->t);
    return NULL;
}

static void run_split(range_fn fn, void *ctx, int64_t n, int nthreads) {
    job_t jobs[SS_MAX_THREADS];
    pthread_t tid[SS_MAX_THREADS];
    int started[SS_MAX_THREADS];
    for (int t = 0; t < nthreads; t++) {
        jobs[t].fn = fn; jobs[t].ctx = ctx; jobs[t].t = t;
        jobs[t].lo = n * t / nthreads; jobs[t].hi = n * (t + 1) / nthreads;
    }
    for (int t = 1; t < nthreads; t++) {
        started[t] = pthread_create(&tid[t], NULL, job_run, &jobs[t]) == 0;
        if (!started[t]) job_run(&jobs[t]);
    }
    job_run(&jobs[0]);
    for (int t = 1; t < nthreads; t++)
        if (started[t]) pthread_join(tid[t], NULL);
}

static int clamp_threads(int nthreads, int64_t n) {
    if (nthreads < 1 || n < SS_PAR_MIN) return 1;
    return nthreads > SS_MAX_THREADS ? SS_MAX_THREADS : nthreads;
}

#define SPINE_ENTRY(NAME, RANGE, T)                                                           \
    typedef struct { const T *x; double K; part_t *parts; } NAME##_ctx;                       \
    static void NAME##_job(void *c, int64_t lo, int64_t hi, int t) {                          \
        NAME##_ctx *ctx = (NAME##_ctx *)c;                                                    \
        RANGE(ctx->x, lo, hi, ctx->K, &ctx->parts[t]);                                        \
    }                                                                                         \
    void NAME(const T *x, int64_t n, int nthreads, double *out) {                             \
        double K = 0.0;                                                                       \
        for (int64_t i = 0; i < n; i++) {                                                     \
            if (isfinite(x[i])) { K = (double)x[i]; break; }                                  \
        }                                                                                     \
        part_t parts[SS_MAX_THREADS], total; /* on the stack: nothing to allocate */          \
        part_init(&total);                                                                    \
        nthreads = clamp_threads(nthreads, n);                                                \
        if (nthreads == 1) { /* no thread for small tensors */                                \
            RANGE(x, 0, n, K, &parts[0]);                                                     \
        } else {                                                                              \
            NAME##_ctx ctx = {x, K, parts};                                                   \
            run_split(NAME##_job, &ctx, n, nthreads);                                         \
        }                                                                                     \
        for (int t = 0; t < nthreads; t++) part_add(&total, &parts[t]);                       \
        finish(&total, n, K, out);                                                            \
    }

SPINE_ENTRY(stepscope_spine_f32, spine_range_f32, float)
SPINE_ENTRY(stepscope_spine_f64, spine_range_f64, double)

/* Many tensors in one call (a stream's due tensors of one step): kinds[i] is 0 for float32 and 1
 * for float64; outs[i] points at that tensor's 15-double row. */
void stepscope_spine_many(int64_t count, const void *const *ptrs, const int64_t *ns,
                          const int32_t *kinds, int nthreads, double *const *outs) {
    for (int64_t i = 0; i < count; i++) {
        if (kinds[i]) stepscope_spine_f64((const double *)ptrs[i], ns[i], nthreads, outs[i]);
        else stepscope_spine_f32((const float *)ptrs[i], ns[i], nthreads, outs[i]);
    }
}

/* Sampled elements of many tensors in one call (the update stream: each parameter at its fixed
 * sample indices, before and after the optimizer step). For tensor i, sample element j is
 * srcs[i][idxs[i][j]] for j < ns[i] (idxs[i] NULL: srcs[i][j], the first ns[i] elements); kinds[i]
 * is 0 for float32 (srcs[i] and dsts[i] float) and 1 for float64 (both double: a float32 copy
 * would round after - before away). subtract == 0 writes the sample into dsts[i]; subtract == 1
 * writes sample - dsts[i] in place (after - before, rounded once in the tensor's dtype, as
 * torch's sub_). The caller checks once that every index lies in [0, numel of srcs[i]).
 * A 4096-element sample of a large parameter is about one element per cache line, so the call
 * reads most of the parameter's memory: its cost is memory traffic. The sorted indices skip
 * lines irregularly, so a software prefetch GATHER_AHEAD samples ahead hides some latency. */
#define GATHER_AHEAD 32
#define GATHER_RANGE(NAME, T)                                                                 \
    static void NAME(const T *restrict src, const int64_t *restrict idx, int64_t n,          \
                     T *restrict dst, int subtract) {                                         \
        if (idx == NULL && !subtract) { memcpy(dst, src, (size_t)n * sizeof(T)); return; }    \
        if (idx == NULL) { for (int64_t j = 0; j < n; j++) dst[j] = src[j] - dst[j]; return; } \
        for (int64_t j = 0; j < n; j++) {                                                     \
            if (j + GATHER_AHEAD < n) __builtin_prefetch(&src[idx[j + GATHER_AHEAD]]);        \
            dst[j] = subtract ? src[idx[j]] - dst[j] : src[idx[j]];                           \
        }                                                                                     \
    }
GATHER_RANGE(gather_f32, float)
GATHER_RANGE(gather_f64, double)

void stepscope_gather_many(int64_t count, const void *const *srcs, const int32_t *kinds,
                           const int64_t *const *idxs, const int64_t *ns, void *const *dsts,
                           int subtract) {
    for (int64_t i = 0; i < count; i++) {
        if (ns[i] <= 0) continue;
        if (kinds[i])
            gather_f64((const double *)srcs[i], idxs[i], ns[i], (double *)dsts[i], subtract);
        else
            gather_f32((const float *)srcs[i], idxs[i], ns[i], (float *)dsts[i], subtract);
    }
}

/* Histogram. table[se] (se = sign and exponent bits) holds the slot for that exponent, with bit 30
 * set when the mantissa thresholds refine it (in-window exponents). Special slots: nb2 + {0 zero,
 * 1 uf+, 2 uf-, 3 of+, 4 of-, 5 nan, 6 +inf, 7 -inf}; subnormals map to underflow (the window
 * starts at or above the smallest normal). Phase 1 computes slot indices for a block (vectorized);
 * phase 2 increments two interleaved private histograms (fewer store-to-load stalls). */
#define HBLOCK 512
#define HIST_RANGE(NAME, T, U, EBITS, MBITS)                                                  \
    SS_CLONES static void NAME(const T *restrict x, int64_t lo, int64_t hi, const int32_t *table,       \
                     const U *thr, int nthr, int64_t nb2, int64_t *h0, int64_t *h1) {         \
        const U emax = ((U)1 << EBITS) - 1;                                                   \
        const U mmask = ((U)1 << MBITS) - 1;                                                  \
        const U absmask = ((U)1 << (EBITS + MBITS)) - 1;                                      \
        int32_t idx[HBLOCK];                                                                  \
        U t0 = nthr > 0 ? thr[0] : mmask + 1, t1 = nthr > 1 ? thr[1] : mmask + 1;             \
        U t2 = nthr > 2 ? thr[2] : mmask + 1;                                                 \
        for (int64_t b = lo; b < hi; b += HBLOCK) {                                           \
            int64_t len = hi - b < HBLOCK ? hi - b : HBLOCK;                                  \
            _Pragma("omp simd")                                                               \
            for (int64_t k = 0; k < len; k++) {                                               \
                U u;                                                                          \
                memcpy(&u, &x[b + k], sizeof(u));                                             \
                U se = u >> MBITS;                                                            \
                U e = se & emax;                                                              \
                U m = u & mmask;                                                              \
                int32_t entry = table[se];                                                    \
                int32_t j = (int32_t)(m >= t0) + (int32_t)(m >= t1) + (int32_t)(m >= t2);    \
                int32_t slot = (entry & 0x3fffffff) + ((entry >> 30) & 1) * j;                \
                slot = (e == emax && m != 0) ? (int32_t)nb2 + 5 : slot;                       \
                slot = ((u & absmask) == 0) ? (int32_t)nb2 : slot;                            \
                idx[k] = slot;                                                                \
            }                                                                                 \
            if (nthr > 3) { /* finer grids: refine in-window slots with the remaining thresholds */ \
                for (int64_t k = 0; k < len; k++) {                                           \
                    U u;                                                                      \
                    memcpy(&u, &x[b + k], sizeof(u));                                         \
                    U se = u >> MBITS, m = u & mmask;                                         \
                    if ((table[se] >> 30) & 1)                                                \
                        for (int q = 3; q < nthr; q++) idx[k] += (m >= thr[q]);               \
                }                                                                             \
            }                                                                                 \
            int64_t k = 0;                                                                    \
            for (; k + 1 < len; k += 2) { h0[idx[k]]++; h1[idx[k + 1]]++; }                   \
            if (k < len) h0[idx[k]]++;                                                        \
        }                                                                                     \
    }

HIST_RANGE(hist_range_f32, float, uint32_t, 8, 23)
HIST_RANGE(hist_range_f64, double, uint64_t, 11, 52)

/* float32 with at most 3 mantissa thresholds (4 bins per octave or fewer, the default): no table
 * lookup per element. Each element's key is its sign and exponent bits (9) and jj = (m != 0) +
 * the number of thresholds its mantissa m reaches (0..4, 3 bits); the keys are counted into two
 * interleaved 4096-entry uint32 histograms that stay in L1, and hist_fold_keys maps the keys to
 * slots once per call: jj == 0 is m == 0 (zero in exponent 0, infinity in exponent 255), jj > 0
 * is a subnormal, a NaN, or in-window bin offset jj - 1. Counts are the same as hist_range_f32's
 * (tests compare the two, and the torch path, bit for bit). */
#define HKEY_BITS 3
#define HKEYS (1 << (9 + HKEY_BITS))
#define HKEY_CHUNK ((int64_t)1 << 30) /* uint32 counters: fold before any can overflow */
#define HKEY_MIN 16384                /* below this the fold costs more than the table path */
#define HKEY_OF(u, key)                                                                       \
    do {                                                                                      \
        uint32_t m_ = (u)&0x7fffffu;                                                          \
        key = ((u) >> 23) << HKEY_BITS;                                                       \
        key = m_ != 0 ? key + 1 : key; /* selects: masked adds, no mask-to-int moves */       \
        key = m_ >= t0 ? key + 1 : key;                                                       \
        key = m_ >= t1 ? key + 1 : key;                                                       \
        key = m_ >= t2 ? key + 1 : key;                                                       \
    } while (0)
#define HKEY_BLOCK(TRACK)                                                                     \
    do {                                                                                      \
        int64_t g = 0;                                                                        \
        for (; g + 16 <= len; g += 16) {                                                      \
            for (uint32_t j = 0; j < 16; j++) {                                               \
                uint32_t u, key;                                                              \
                memcpy(&u, &xb[g + j], sizeof(u));                                            \
                HKEY_OF(u, key);                                                              \
                if (TRACK) diff |= key ^ key0;                                                \
                /* zeros (sparse and ReLU tensors: often most elements) spread over 16        \
                 * counters by position, so that their increments do not wait on each other */ \
                idx[g + j] = (u & 0x7fffffffu) == 0 ? HKEYS + j : key;                        \
            }                                                                                 \
        }                                                                                     \
        for (; g < len; g++) {                                                                \
            uint32_t u, key;                                                                  \
            memcpy(&u, &xb[g], sizeof(u));                                                    \
            HKEY_OF(u, key);                                                                  \
            diff |= key ^ key0;                                                               \
            idx[g] = key;                                                                     \
        }                                                                                     \
    } while (0)
SS_CLONES static void hist_keys_f32(const float *restrict x, int64_t n, const uint32_t *thr,
                                    int nthr, uint32_t *restrict h0, uint32_t *restrict h1) {
    const uint32_t never = 0xffffffffu; /* no 23-bit mantissa reaches it */
    uint32_t t0 = nthr > 0 ? thr[0] : never, t1 = nthr > 1 ? thr[1] : never;
    uint32_t t2 = nthr > 2 ? thr[2] : never;
    uint32_t idx[HBLOCK];
    for (int64_t b = 0; b < n; b += HBLOCK) {
        int64_t len = n - b < HBLOCK ? n - b : HBLOCK;
        const float *xb = x + b;
        uint32_t u0, key0, diff = 0;
        memcpy(&u0, xb, sizeof(u0));
        HKEY_OF(u0, key0);
        /* a block that starts with 16 equal keys may be constant: only then track diff */
        for (int64_t g = 0; g < 16 && g < len; g++) {
            uint32_t u, key;
            memcpy(&u, &xb[g], sizeof(u));
            HKEY_OF(u, key);
            diff |= key ^ key0;
        }
        if (diff == 0) HKEY_BLOCK(1);
        else HKEY_BLOCK(0);
        if (diff == 0) { /* one key for the whole block (a constant tensor): one add */
            h0[key0] += (uint32_t)len;
            continue;
        }
        int64_t k = 0;
        for (; k + 1 < len; k += 2) { h0[idx[k]]++; h1[idx[k + 1]]++; }
        if (k < len) h0[idx[k]]++;
    }
}

static void hist_fold_keys(const uint32_t *h0, const uint32_t *h1, const int32_t *table,
                           int64_t nb2, int64_t *out) {
    for (int key = 0; key < HKEYS; key++) {
        uint32_t c0 = h0[key], c1 = h1[key];
        if ((c0 | c1) == 0) continue;
        int se = key >> HKEY_BITS, jj = key & ((1 << HKEY_BITS) - 1), e = se & 0xff;
        int32_t entry = table[se];
        int64_t slot;
        if (e == 0xff) slot = jj ? nb2 + 5 : (entry & 0x3fffffff);  /* NaN : +-inf */
        else if (e == 0) slot = jj ? (entry & 0x3fffffff) : nb2;    /* subnormal : zero */
        else slot = (entry & 0x3fffffff) + ((entry >> 30) & 1) * (jj ? jj - 1 : 0);
        out[slot] += (int64_t)c0 + (int64_t)c1;
    }
    for (int key = HKEYS; key < HKEYS + 16; key++) out[nb2] += (int64_t)h0[key] + (int64_t)h1[key];
}

static void hist_range_f32_any(const float *restrict x, int64_t lo, int64_t hi,
                               const int32_t *table, const uint32_t *thr, int nthr, int64_t nb2,
                               int64_t *h0, int64_t *h1) {
    if (nthr > 3 || hi - lo < HKEY_MIN) {
        hist_range_f32(x, lo, hi, table, thr, nthr, nb2, h0, h1);
        return;
    }
    uint32_t k0[HKEYS + 16], k1[HKEYS + 16]; /* 32 KiB on the stack: nothing to allocate */
    for (int64_t b = lo; b < hi; b += HKEY_CHUNK) {
        int64_t len = hi - b < HKEY_CHUNK ? hi - b : HKEY_CHUNK;
        memset(k0, 0, sizeof(k0));
        memset(k1, 0, sizeof(k1));
        hist_keys_f32(x + b, len, thr, nthr, k0, k1);
        hist_fold_keys(k0, k1, table, nb2, h0);
    }
}

#define HIST_ENTRY(NAME, RANGE, T, U)                                                         \
    typedef struct {                                                                          \
        const T *x; const int32_t *table; const U *thr; int nthr; int64_t nb2, width;         \
        int64_t *local;                                                                       \
    } NAME##_ctx;                                                                             \
    static void NAME##_job(void *c, int64_t lo, int64_t hi, int t) {                          \
        NAME##_ctx *k = (NAME##_ctx *)c;                                                      \
        int64_t *h0 = k->local + (size_t)t * 2 * k->width;                                    \
        RANGE(k->x, lo, hi, k->table, k->thr, k->nthr, k->nb2, h0, h0 + k->width);            \
    }                                                                                         \
    void NAME(const T *x, int64_t n, const int32_t *table,                                    \
              const U *thr, int nthr, int64_t nb2, int64_t width, int nthreads, int64_t *out) { \
        if (n < 4096) { /* small tensors: straight into out (no private rows to zero and add) */ \
            RANGE(x, 0, n, table, thr, nthr, nb2, out, out);                                  \
            return;                                                                           \
        }                                                                                     \
        nthreads = clamp_threads(nthreads, n);                                                \
        int64_t *local = (int64_t *)calloc((size_t)nthreads * 2 * (size_t)width, sizeof(int64_t)); \
        if (local == NULL && nthreads > 1) {                                                  \
            nthreads = 1;                                                                     \
            local = (int64_t *)calloc(2 * (size_t)width, sizeof(int64_t));                    \
        }                                                                                     \
        if (local == NULL) { /* out of memory: count straight into out (same counts, slower) */ \
            RANGE(x, 0, n, table, thr, nthr, nb2, out, out);                                  \
            return;                                                                           \
        }                                                                                     \
        NAME##_ctx ctx = {x, table, thr, nthr, nb2, width, local};                            \
        if (nthreads == 1) NAME##_job(&ctx, 0, n, 0);                                         \
        else run_split(NAME##_job, &ctx, n, nthreads);                                        \
        for (int64_t t = 0; t < 2 * (int64_t)nthreads; t++)                                   \
            for (int64_t k = 0; k < width; k++) out[k] += local[t * width + k];               \
        free(local);                                                                          \
    }

HIST_ENTRY(stepscope_hist_f32, hist_range_f32_any, float, uint32_t)
HIST_ENTRY(stepscope_hist_f64, hist_range_f64, double, uint64_t)

/* Spine and histogram of one float32 tensor in one read: chunks of SH_CHUNK elements (in L1) go
 * through the spine's blocks and then the histogram's keys (or its slot table), so a histogram
 * step reads each tensor once. The same numbers as stepscope_spine_f32 then stepscope_hist_f32
 * (bit for bit: the spine's blocks and the histogram's counts are the same). Adds into
 * hist_out, like stepscope_hist_f32. Several threads: the two threaded kernels one after the
 * other. SH_CHUNK is a multiple of SS_BLOCK, so the spine sees the same blocks in the same order
 * as one stepscope_spine_f32 call. */
#define SH_CHUNK 8192
_Static_assert(SH_CHUNK % SS_BLOCK == 0, "a chunk holds whole spine blocks");
void stepscope_spine_hist_f32(const float *x, int64_t n, const int32_t *table, const uint32_t *thr,
                              int nthr, int64_t nb2, int64_t width, int nthreads,
                              double *spine_out, int64_t *hist_out) {
    if (clamp_threads(nthreads, n) > 1) {
        stepscope_spine_f32(x, n, nthreads, spine_out);
        stepscope_hist_f32(x, n, table, thr, nthr, nb2, width, nthreads, hist_out);
        return;
    }
    double K = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(x[i])) { K = (double)x[i]; break; }
    }
    part_t total;
    part_init(&total);
    int keys = nthr <= 3 && n >= HKEY_MIN;
    uint32_t k0[HKEYS + 16], k1[HKEYS + 16];
    if (keys) { memset(k0, 0, sizeof(k0)); memset(k1, 0, sizeof(k1)); }
    int64_t since_fold = 0;
    for (int64_t b = 0; b < n; b += SH_CHUNK) {
        int64_t len = n - b < SH_CHUNK ? n - b : SH_CHUNK;
        spine_range_f32_acc(x, b, b + len, K, &total); /* the blocks of one whole-range call */
        if (!keys) {
            hist_range_f32(x, b, b + len, table, thr, nthr, nb2, hist_out, hist_out);
            continue;
        }
        if (since_fold + len > HKEY_CHUNK) { /* uint32 counters: fold before any can overflow */
            hist_fold_keys(k0, k1, table, nb2, hist_out);
            memset(k0, 0, sizeof(k0)); memset(k1, 0, sizeof(k1));
            since_fold = 0;
        }
        hist_keys_f32(x + b, len, thr, nthr, k0, k1);
        since_fold += len;
    }
    if (keys) hist_fold_keys(k0, k1, table, nb2, hist_out);
    (void)width;
    finish(&total, n, K, spine_out);
}

/* Spines and histograms of many tensors in one call (a stream's due tensors on a histogram
 * step). kinds[i] is 0 for float32 and 1 for float64; tables[kind], thrs[kind] and nthrs[kind]
 * are that format's slot table and mantissa thresholds (stats/binning.py's slot_tables). Each spine row is
 * written, each histogram row overwritten. */
void stepscope_spine_hist_many(int64_t count, const void *const *ptrs, const int64_t *ns,
                               const int32_t *kinds, int nthreads, double *const *spine_outs,
                               int64_t *const *hist_outs, const void *const *tables,
                               const void *const *thrs, const int32_t *nthrs, int64_t nb2,
                               int64_t width) {
    for (int64_t i = 0; i < count; i++) {
        memset(hist_outs[i], 0, (size_t)width * sizeof(int64_t));
        int k = kinds[i] ? 1 : 0;
        const int32_t *table = (const int32_t *)tables[k];
        if (k) {
            stepscope_spine_f64((const double *)ptrs[i], ns[i], nthreads, spine_outs[i]);
            stepscope_hist_f64((const double *)ptrs[i], ns[i], table, (const uint64_t *)thrs[k],
                               nthrs[k], nb2, width, nthreads, hist_outs[i]);
        } else {
            stepscope_spine_hist_f32((const float *)ptrs[i], ns[i], table,
                                     (const uint32_t *)thrs[k], nthrs[k], nb2, width, nthreads,
                                     spine_outs[i], hist_outs[i]);
        }
    }
}

/* Fold spine row b into spine row a in place (a module called again in one step): the same
 * operations, in the same order, as merge_spine_rows in stats/reduce.py, so the folded row is
 * bit for bit what the torch/numpy merge gives. Counts and sums add; min/max/absmax combine like
 * numpy's and torch's fmin/fmax (a NaN side yields the other; on a tie, -0.0 against 0.0, the
 * first operand);
 * mean and m2 by Chan's pairwise formulas over the finite counts. Built without FMA contraction
 * (-std=c11 implies -ffp-contract=off), so every product and sum rounds as in numpy. */
static double ss_fmin(double x, double y) { return isnan(y) ? x : isnan(x) ? y : y < x ? y : x; }
static double ss_fmax(double x, double y) { return isnan(y) ? x : isnan(x) ? y : y > x ? y : x; }

void stepscope_spine_merge(double *a, const double *b) {
    double na = a[1], nb = b[1], ma = a[13], mb = b[13], m2a = a[14], m2b = b[14];
    double out[15];
    for (int i = 0; i < 15; i++) out[i] = a[i] + b[i];
    out[7] = ss_fmin(a[7], b[7]);
    out[8] = ss_fmax(a[8], b[8]);
    out[9] = ss_fmax(a[9], b[9]);
    double n = na + nb;
    double delta = mb - ma;
    double mean = ma + delta * (nb / n);
    double m2 = m2a + m2b + delta * delta * (na * nb / n);
    out[13] = na == 0 ? mb : (nb == 0 ? ma : mean);
    out[14] = na == 0 ? m2b : (nb == 0 ? m2a : m2);
    memcpy(a, out, sizeof(out));
}

int stepscope_kernels_version(void) { return 8; }

/* Which instruction set the dispatched loops use: 5 = x86-64-v4 clone (AVX-512 + FMA), 4 =
 * x86-64-v3 clone (AVX2 + FMA), 3 = AVX-512F clone, 2 = AVX2 clone (compilers before GCC 12),
 * 1 = baseline clone, 0 = one portable build (no runtime dispatch on this platform/compiler). */
int stepscope_kernels_isa(void) {
#if defined(STEPSCOPE_FORCED_ISA) /* one level only (STEPSCOPE_KERNEL_ISA, see _native.py) */
    return STEPSCOPE_FORCED_ISA;
#elif defined(SS_DISPATCH) && defined(SS_LEVELS)
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") ? 5 : __builtin_cpu_supports("x86-64-v3") ? 4 : 1;
#elif defined(SS_DISPATCH)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 3 : __builtin_cpu_supports("avx2") ? 2 : 1;
#else
    return 0;
#endif
}
