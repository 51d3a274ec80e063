/* Sequential accumulation for anynum's emulation: C[i,j] = sum_k A[i,k] * B[k,j], left to right,
 * with every product and every partial sum rounded onto a float or posit grid (deterministic modes).
 *
 * The rounding functions mirror anynum's torch kernels bit for bit (tests compare them on every
 * code and on random pairs): `round_float` is kernels/eager.py's float rule, `round_posit` the
 * bit-pattern rule of kernels/posit.py. They exist only for this loop: everything else rounds
 * through anynum.quantize and the kernel router. An exact error term e (TwoSum, or the fma
 * product error) is applied by the project's one rule for exact pairs (anynum.ops.core.round_exact):
 * y + e is first rounded to odd in float64 (y, or its neighbour towards e where y is even), which
 * rounds onto any grid whose values and boundaries are even float64s like y + e itself.
 *
 * `round_fast` is a branch-light round-to-nearest-even for binades where the grid keeps at least
 * one fraction bit (a per-binade table of kept bits): add half an ulp minus one plus the last kept
 * bit to the float64 bit pattern and clear the dropped bits. Binades outside the table's safe range
 * go to the full rule.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int32_t kind;        /* 0 float, 1 posit */
    int32_t mode;        /* 0 rne, 1 rna, 2 rnz, 3 rz, 4 ru, 5 rd, 6 ro */
    /* float formats */
    int32_t man_bits;
    int32_t emin;        /* exponent of the smallest normal */
    int32_t subnormals;
    int32_t overflow;    /* 0 saturate, 1 inf, 2 nan */
    int32_t neg_zero;
    double max;
    double smallest_normal;
    /* posits */
    int32_t n;
    int32_t es;
    double minpos;
    double maxpos;
    /* rounding of pairs */
    int32_t pair_ok;     /* ops.core.odd_rounding_applies(fmt): rounding to odd first is exact */
    int32_t needs_pair;  /* Grid.needs_pair: plain sums of two grid values still nudge */
    const int16_t *fast; /* kept fraction bits per biased float64 exponent (2049 entries), <= 0: full
                          * rule; NULL unless the mode is round-to-nearest-even */
} Params;

static inline double copysign_(double m, double x) { return copysign(m, x); }

static double round_scaled(double s, int mode) {
    /* anynum.rounding.round_scaled for the deterministic modes */
    double a, lo, f;
    switch (mode) {
    case 0: return nearbyint(s);
    case 3: return trunc(s);
    case 4: return ceil(s);
    case 5: return floor(s);
    default: break;
    }
    a = fabs(s);
    lo = floor(a);
    f = a - lo;
    int away;
    if (mode == 1) away = f >= 0.5;
    else if (mode == 2) away = f > 0.5;
    else away = (f > 0) && (fmod(lo, 2.0) == 0.0);
    return copysign_(lo + (double)away, s);
}

static double round_float(double x, const Params *p, int mode) {
    double a = fabs(x), step, y;
    if (isnan(x)) return x;
    if (isinf(x)) {
        y = x;
    } else {
        int e2;
        if (a == 0) {
            step = ldexp(1.0, p->emin - p->man_bits);
        } else {
            frexp(a, &e2);
            int E = e2 - 1;
            if (E < p->emin) E = p->emin;
            step = ldexp(1.0, E - p->man_bits);
        }
        if (!p->subnormals && a < p->smallest_normal) step = p->smallest_normal;
        y = round_scaled(x / step, mode) * step;
        y = copysign_(y, x);
    }
    /* apply_overflow */
    double m = fabs(y);
    if (m > p->max) {
        if (p->overflow == 0) {
            m = p->max;
        } else {
            int to_beyond;
            int xinf = isinf(x);
            if (mode == 3 || mode == 6) to_beyond = xinf;
            else if (mode == 4) to_beyond = xinf || x > 0;
            else if (mode == 5) to_beyond = xinf || x < 0;
            else to_beyond = 1;
            m = to_beyond ? (p->overflow == 2 ? NAN : INFINITY) : p->max;
        }
        y = copysign_(m, y);
    }
    if (!p->neg_zero && y == 0) y = 0.0;
    return y;
}

static double posit_decode(int64_t c, int n, int es) {
    /* value of the magnitude code c in [1, 2**(n-1) - 1] */
    int top = n - 2, r = 0, first = (int)((c >> top) & 1), i;
    for (i = top; i >= 0 && (int)((c >> i) & 1) == first; i--) r++;
    int k = first ? r - 1 : -r;
    int rem = n - 1 - r - 1; /* bits after the regime and its terminating bit */
    if (rem < 0) rem = 0;
    int64_t tail = c & ((rem > 0) ? ((((int64_t)1) << rem) - 1) : 0);
    int64_t e;
    int fl;
    if (rem >= es) {
        e = tail >> (rem - es);
        fl = rem - es;
    } else {
        e = tail << (es - rem); /* cut exponent bits read as zeros */
        fl = 0;
    }
    int64_t frac = fl > 0 ? (tail & ((((int64_t)1) << fl) - 1)) : 0;
    double sig = 1.0 + ldexp((double)frac, -fl);
    return ldexp(sig, k * (1 << es) + (int)e);
}

static double round_posit(double x, const Params *p, int mode) {
    if (isnan(x) || isinf(x)) return NAN;
    double a = fabs(x);
    if (a == 0) return 0.0;
    double mag;
    if (a >= p->maxpos) {
        mag = p->maxpos;
    } else if (a < p->minpos) {
        mag = p->minpos;
    } else {
        int n = p->n, es = p->es, e2;
        double m = frexp(a, &e2);
        int E = e2 - 1;
        int useed_log = 1 << es;
        int k = E >= 0 ? E / useed_log : -((-E + useed_log - 1) / useed_log);
        int e = E - k * useed_log;
        int rl = k >= 0 ? k + 2 : -k + 1;
        int mbits = n - 1 - rl;                     /* bits kept after the regime, >= 0 */
        uint64_t frac52 = (uint64_t)ldexp(m * 2.0 - 1.0, 52);
        uint64_t z = ((uint64_t)e << 52) | frac52;  /* es + 52 bits */
        int total = es + 52;
        int drop = total - mbits;
        uint64_t kept = drop >= 64 ? 0 : z >> drop;
        uint64_t dropped = drop >= 64 ? z : (z & ((((uint64_t)1) << drop) - 1));
        uint64_t regime = k >= 0 ? ((((uint64_t)1) << (k + 2)) - 2) : 1;
        int64_t code = (int64_t)((regime << mbits) | kept);
        uint64_t half = ((uint64_t)1) << (drop - 1);
        int inexact = dropped != 0;
        int guard = (dropped & half) != 0;
        int sticky = (dropped & (half - 1)) != 0;
        int up = 0, neg = x < 0;
        switch (mode) {
        case 0: up = guard && (sticky || (code & 1)); break;
        case 1: up = guard; break;
        case 2: up = guard && sticky; break;
        case 3: up = 0; break;
        case 4: up = inexact && !neg; break;
        case 5: up = inexact && neg; break;
        default: up = inexact && !(code & 1); break;
        }
        mag = posit_decode(code + up, n, es);
        if (mag < p->minpos) mag = p->minpos;
    }
    return x < 0 ? -mag : mag;
}

static double round_mode(double x, const Params *p, int mode) {
    return p->kind == 0 ? round_float(x, p, mode) : round_posit(x, p, mode);
}

static double round_full(double x, const Params *p) { return round_mode(x, p, p->mode); }

static inline double round_fast(double x, const Params *p) __attribute__((always_inline));
static inline double round_fast(double x, const Params *p) {
    uint64_t bits;
    memcpy(&bits, &x, 8);
    int ex = (int)((bits >> 52) & 0x7ff);
    int kept = p->fast[ex];
    if (__builtin_expect(kept <= 0 || p->fast[ex + 1] <= 0, 0)) return round_full(x, p);
    int shift = 52 - kept;
    uint64_t lsb = (bits >> shift) & 1;
    bits += (((uint64_t)1) << (shift - 1)) - 1 + lsb;
    bits &= ~((((uint64_t)1) << shift) - 1);
    double y;
    memcpy(&y, &bits, 8);
    return y;
}

static inline double round_pair(double y, double e, int force, const Params *p) {
    if (e != 0 && p->pair_ok && (force || p->needs_pair) && isfinite(y)) {
        uint64_t bits;
        memcpy(&bits, &y, 8);
        if (!(bits & 1)) y = nextafter(y, e > 0 ? INFINITY : -INFINITY); /* round to odd */
    }
    return p->fast ? round_fast(y, p) : round_full(y, p);
}

/* out[i] = the pair (x[i], e[i]) rounded once (e may be NULL: plain rounding): the rounding the
 * loop below applies, exported so tests hold it to the torch reference on every code. */
void anynum_emu_round(const double *x, const double *e, double *out, int64_t n, const Params *p) {
    for (int64_t i = 0; i < n; i++) out[i] = round_pair(x[i], e ? e[i] : 0.0, 1, p);
}

/* out[i] = x[i] + y[i] rounded once (TwoSum's error term decides what float64 drops): the step of
 * the loop below on its own, for the elementwise sums whose exact value float64 may not hold
 * (a + v * b * c, and + - in directed modes), where the torch pair rounding takes a dozen passes. */
void anynum_emu_add_round(const double *x, const double *y, double *out, int64_t n, const Params *p) {
    for (int64_t i = 0; i < n; i++) {
        double s = x[i] + y[i];
        double bb = s - x[i];
        double e = isfinite(s) ? (x[i] - (s - bb)) + (y[i] - bb) : 0.0;
        out[i] = round_pair(s, e, 1, p);
    }
}

/* Outputs [row0, row1) x [col0, col1) of C = A @ B, A [M, K] and B [K, N] row-major, C [M, N].
 * exact: every product is exact in float64 (no TwoProduct error term needed). Columns are
 * processed in tiles of JB so that a tile of C and the tile's rows of B stay in cache while the
 * reduction runs; the order along k is the same for every output. */
#define JB 256

/* The vectorised round_fast. In SIMD lanes a table lookup would be a gather (slow, or not
 * emitted at all), so the lanes compute the table's shift, 52 - kept fraction bits, from the
 * biased float64 exponent ex: posits from the regime length, floats from the subnormal distance.
 * `Lanes` holds the range [lo, hi] of ex where round_fast takes its fast rule; anynum_seq_dot
 * checks the formula against the table on that whole range before any lane uses it (and checks
 * that the fast rule holds exactly there), else the scalar loop runs. */
typedef struct {
    int64_t lo;
    uint64_t span;       /* lanes with ex - lo <= span (unsigned) take the fast rule */
    int64_t n, es, rl_shift; /* posits: shift = regime length + rl_shift */
    int64_t man_bits, emin_ex; /* floats: emin_ex = the biased exponent of the smallest normal */
    uint64_t zero_sign;  /* the sign bit where round_full keeps a zero's sign (float formats with -0) */
} Lanes;

static inline uint64_t bits_of(double x) {
    uint64_t u;
    memcpy(&u, &x, 8);
    return u;
}

static inline double of_bits(uint64_t u) {
    double x;
    memcpy(&x, &u, 8);
    return x;
}

/* The table's shift (52 - kept fraction bits) of the binade with biased float64 exponent ex. */
static inline int64_t lane_shift(int64_t ex, int posit, const Lanes L) __attribute__((always_inline));
static inline int64_t lane_shift(int64_t ex, int posit, const Lanes L) {
    if (posit) {
        /* the regime k = floor((ex - 1023) / 2**es) is |k| + 2 bits long for k >= 0, |k| + 1 for k < 0 */
        int64_t k = (ex - 1023) >> L.es;
        return (k < 0 ? -k : k) + (k >> 63) + L.rl_shift;
    }
    int64_t below = L.emin_ex - ex;
    return 52 - L.man_bits + (below > 0 ? below : 0);
}

/* round_fast(x) where it takes its fast rule, and round_full's result for zeros; any other lane
 * (NaN, inf, float64 subnormals, binades the table leaves to the full rule) sets bits in *bad,
 * and the caller redoes the step with the scalar functions (a bad lane's value is not used).
 *
 * Rounding to nearest even at the binade's step u = 2**(E - kept) is float64's own addition:
 * with C = 1.5 * 2**52 * u, x + C lies in C's binade, whose ulp is u, so the sum rounds x to a
 * multiple of u, ties to even (the default rounding mode), and subtracting C is exact. This is
 * the bit rule of round_fast (carries into the next binade included: 2**(E + 1) is a multiple of
 * u), for either sign, as long as |x| < 2**(E + 1) <= 2**(E + shift - 1) (shift >= 2). A zero
 * gives (±0 + C) - C = +0, round_full's zero for posits; float formats with -0 keep the zero's
 * sign. Without -ffast-math (and with -ffp-contract=off) the compiler keeps both operations. */
static inline double lane_round(double x, int posit, const Lanes L, uint64_t *bad) __attribute__((always_inline));
static inline double lane_round(double x, int posit, const Lanes L, uint64_t *bad) {
    uint64_t bits = bits_of(x);
    uint64_t mag2 = bits << 1;
    int64_t ex = (int64_t)(mag2 >> 53);
    *bad |= (uint64_t)(ex - L.lo) <= L.span || mag2 == 0 ? 0 : ~(uint64_t)0;
    double c = of_bits(((uint64_t)(ex + lane_shift(ex, posit, L)) << 52) | (((uint64_t)1) << 51));
    double r = (x + c) - c;
    if (posit) return r;
    uint64_t zero = mag2 == 0 ? ~(uint64_t)0 : 0;
    return of_bits(((bits & L.zero_sign) & zero) | (bits_of(r) & ~zero));
}

/* The common case (round to nearest even with the table, exact products, no fma): two roundings
 * per product, no error terms. Each step along k computes the new partial sums of `rows` rows of
 * a tile into a second buffer in SIMD lanes (the tile's row of B, read once from memory, serves
 * them all from cache); a step with any lane outside the fast rule is recomputed with the scalar
 * round_fast (which is what the lanes compute where they apply), so every output sees the same
 * roundings in the same order as the scalar loop. */
#define RB 4 /* rows per pass over a tile of B (plain_rows handles up to RB) */

static inline void plain_rows(const double *A, const double *B, double *C, int64_t i0, int rows, int64_t K,
                              int64_t N, int64_t j0, int64_t jn, int posit, const Lanes L, const Params *p)
    __attribute__((always_inline));
static inline void plain_rows(const double *A, const double *B, double *C, int64_t i0, int rows, int64_t K,
                              int64_t N, int64_t j0, int64_t jn, int posit, const Lanes L, const Params *p) {
    double buf[2][RB][JB];
    double(*cur)[JB] = buf[0], (*nxt)[JB] = buf[1];
    for (int64_t k = 0; k < K; k++) {
        const double *b = B + k * N + j0;
        for (int r = 0; r < rows; r++) {
            const double a = A[(i0 + r) * K + k];
            double *o = nxt[r];
            const double *c = cur[r];
            uint64_t bad = 0;
            if (k == 0) {
                for (int64_t j = 0; j < jn; j++) o[j] = lane_round(lane_round(a * b[j], posit, L, &bad), posit, L, &bad);
                if (bad)
                    for (int64_t j = 0; j < jn; j++) o[j] = round_fast(round_fast(a * b[j], p), p);
            } else {
                for (int64_t j = 0; j < jn; j++) {
                    double prod = lane_round(a * b[j], posit, L, &bad);
                    o[j] = lane_round(c[j] + prod, posit, L, &bad);
                }
                if (bad)
                    for (int64_t j = 0; j < jn; j++) o[j] = round_fast(c[j] + round_fast(a * b[j], p), p);
            }
        }
        double(*t)[JB] = cur;
        cur = nxt;
        nxt = t;
    }
    for (int r = 0; r < rows; r++) memcpy(C + (i0 + r) * N + j0, cur[r], (size_t)jn * sizeof(double));
}

static inline void seq_tile_plain(const double *A, const double *B, double *C, int64_t row0, int64_t row1,
                                  int64_t K, int64_t N, int64_t j0, int64_t jn, int posit, const Lanes L,
                                  const Params *p) __attribute__((always_inline));
static inline void seq_tile_plain(const double *A, const double *B, double *C, int64_t row0, int64_t row1,
                                  int64_t K, int64_t N, int64_t j0, int64_t jn, int posit, const Lanes L,
                                  const Params *p) {
    int64_t i = row0;
    for (; i + RB <= row1; i += RB) plain_rows(A, B, C, i, RB, K, N, j0, jn, posit, L, p);
    switch (row1 - i) { /* the last rows together, with the number of rows a constant */
    case 3: plain_rows(A, B, C, i, 3, K, N, j0, jn, posit, L, p); break;
    case 2: plain_rows(A, B, C, i, 2, K, N, j0, jn, posit, L, p); break;
    case 1: plain_rows(A, B, C, i, 1, K, N, j0, jn, posit, L, p); break;
    default: break;
    }
}

/* The Lanes of `p`: 1 where the lanes reproduce round_fast on every binade it rounds with its bit
 * rule, 0 where they might not (the scalar loop then runs). Binades whose rounding constant C
 * would not be a finite double are left to the scalar functions; the rest are checked one by one:
 * the formula's shift equals the table's, and 2 <= shift (|x| + C stays in C's binade). */
static int lanes_for(const Params *p, Lanes *L) {
    int64_t shift[2048];
    int64_t lo = -1, hi = -1;
    if (p->kind == 1 && (p->es < 0 || p->es > 20)) return 0;
    for (int ex = 0; ex < 2048; ex++) {
        shift[ex] = (p->fast[ex] > 0 && p->fast[ex + 1] > 0) ? 52 - p->fast[ex] : 0;
        if (shift[ex] && lo < 0) lo = ex;
        if (shift[ex]) hi = ex;
    }
    while (hi >= lo && hi + shift[hi] > 2046) hi--;
    if (lo < 1 || hi < lo) return 0;
    memset(L, 0, sizeof(*L));
    L->lo = lo;
    L->span = (uint64_t)(hi - lo);
    L->n = p->n;
    L->es = p->es;
    L->rl_shift = 52 - (p->n - 1 - p->es) + 2;
    L->man_bits = p->man_bits;
    L->emin_ex = (int64_t)p->emin + 1023;
    /* round_full of a zero: +0 for posits and formats without -0, else the zero itself */
    L->zero_sign = (p->kind == 0 && p->neg_zero) ? ((uint64_t)1) << 63 : 0;
    for (int64_t ex = lo; ex <= hi; ex++) {
        int64_t s = lane_shift(ex, p->kind == 1, *L);
        if (shift[ex] == 0 || s != shift[ex] || s < 2 || ex + s > 2046) return 0;
    }
    for (int sign = 0; sign < 2; sign++) { /* zeros: round_full's, sign included */
        uint64_t bad = 0;
        double z = sign ? -0.0 : 0.0;
        double got = lane_round(z, p->kind == 1, *L, &bad), want = round_full(z, p);
        if (bad || bits_of(got) != bits_of(want)) return 0;
    }
    return 1;
}

static void seq_tile(const double *A, const double *B, double *C, int64_t row0, int64_t row1, int64_t K,
                     int64_t N, int64_t j0, int64_t jn, int32_t fma_mode, int32_t exact, const Params *p) {
    for (int64_t i = row0; i < row1; i++) {
        double *c = C + i * N + j0;
        const double *arow = A + i * K;
        for (int64_t k = 0; k < K; k++) {
            double a = arow[k];
            const double *b = B + k * N + j0;
            for (int64_t j = 0; j < jn; j++) {
                double prod = a * b[j];
                double pe = (exact || !isfinite(prod)) ? 0.0 : fma(a, b[j], -prod);
                if (!fma_mode) {
                    prod = round_pair(prod, pe, !exact, p);
                    pe = 0.0;
                }
                if (k == 0) {
                    c[j] = round_pair(prod, pe, fma_mode || !exact, p);
                    continue;
                }
                double s = c[j];
                double y = s + prod;
                double bb = y - s;
                double err = isfinite(y) ? (s - (y - bb)) + (prod - bb) : 0.0;
                if (fma_mode) { /* accumulate._add_tail: y + err + pe, the remainder's sign exact */
                    double t = err + pe;
                    double bt = t - err;
                    double tt = (err - (t - bt)) + (pe - bt);
                    double y2 = y + t;
                    double b2 = y2 - y;
                    err = isfinite(y2) ? ((y - (y2 - b2)) + (t - b2)) + tt : 0.0;
                    y = y2;
                }
                c[j] = round_pair(y, err, fma_mode, p);
            }
        }
    }
}

void anynum_seq_dot(const double *A, const double *B, double *C, int64_t row0, int64_t row1, int64_t K,
                    int64_t N, int64_t col0, int64_t col1, int32_t fma_mode, int32_t exact, const Params *p) {
    Lanes L;
    int plain = !fma_mode && exact && !p->needs_pair && p->fast && K > 0 && lanes_for(p, &L);
    for (int64_t j0 = col0; j0 < col1; j0 += JB) {
        int64_t jn = col1 - j0 < JB ? col1 - j0 : JB;
        if (plain && p->kind == 1)
            seq_tile_plain(A, B, C, row0, row1, K, N, j0, jn, 1, L, p);
        else if (plain)
            seq_tile_plain(A, B, C, row0, row1, K, N, j0, jn, 0, L, p);
        else
            seq_tile(A, B, C, row0, row1, K, N, j0, jn, fma_mode, exact, p);
    }
}
