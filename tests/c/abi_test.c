/*
 * C-side test of the attn-kernels C ABI, built with the system C compiler and run by
 * tests/tests/c_abi.rs. Usage: abi_test DATA_DIR
 *
 * DATA_DIR holds cases written by the Rust test: inputs, the reference's result and the
 * per-element error bound derived for it. This program calls the ABI (sgemm, attention and
 * decode, positional and through AttnAttentionArgs, layer norm, multi-head attention with and without a caller workspace
 * and with bf16 weights and activations through AttnLayerOptions), checks each
 * result against the reference within its bound, then checks that bad arguments return the
 * right status codes. Exit status: the number of failed checks.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernels.h"

#include "check.h"

#define EXPECT_STATUS(call, want)                                                             \
    do {                                                                                      \
        AttnStatus got_ = (call);                                                             \
        CHECK(got_ == (want), "%s: got %s, want %s", #call, attn_status_name(got_),           \
              attn_status_name(want));                                                        \
    } while (0)

/* A case file: a sequence of arrays, each `u64 count` then `count` u64 or f32 values. */
typedef struct {
    FILE *f;
    const char *name;
} Reader;

static Reader open_case(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    Reader r = {fopen(path, "rb"), name};
    if (!r.f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(100);
    }
    return r;
}

static uint64_t read_count(Reader *r) {
    uint64_t n;
    if (fread(&n, sizeof n, 1, r->f) != 1) {
        fprintf(stderr, "%s: truncated\n", r->name);
        exit(101);
    }
    return n;
}

static uint64_t *read_u64s(Reader *r, uint64_t *n) {
    *n = read_count(r);
    uint64_t *v = malloc((*n ? *n : 1) * sizeof *v);
    if (fread(v, sizeof *v, *n, r->f) != *n) exit(102);
    return v;
}

static float *read_f32s(Reader *r, uint64_t *n) {
    *n = read_count(r);
    float *v = malloc((*n ? *n : 1) * sizeof *v);
    if (fread(v, sizeof *v, *n, r->f) != *n) exit(103);
    return v;
}

/* |got - want| <= tol elementwise. */
static void check_close(const char *what, const float *got, const float *want, const float *tol,
                        size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float e = fabsf(got[i] - want[i]);
        if (!(e <= tol[i])) {
            if (bad < 5)
                fprintf(stderr, "%s[%zu]: got %.9g want %.9g err %.3g > tol %.3g\n", what, i,
                        got[i], want[i], e, tol[i]);
            bad++;
        }
    }
    CHECK(bad == 0, "%s: %zu of %zu elements outside the reference bound", what, bad, n);
}

static AttnMat mat(const void *data, size_t rows, size_t cols, size_t rs, size_t cs) {
    AttnMat m = {data, rows, cols, rs, cs, 0};
    return m;
}

static AttnMatMut mat_mut(void *data, size_t rows, size_t cols, size_t rs, size_t cs) {
    AttnMatMut m = {data, rows, cols, rs, cs, 0};
    return m;
}

/* [b, s, h, d] contiguous storage seen as [b, h, s, d]. */
static AttnTensor bshd(const void *data, size_t b, size_t s, size_t h, size_t d) {
    AttnTensor t = {data, {b, h, s, d}, {s * h * d, d, h * d, 1}, 0};
    return t;
}

static AttnTensorMut bshd_mut(void *data, size_t b, size_t s, size_t h, size_t d) {
    AttnTensorMut t = {data, {b, h, s, d}, {s * h * d, d, h * d, 1}, 0};
    return t;
}

static void test_sgemm(const char *dir) {
    Reader r = open_case(dir, "sgemm.bin");
    uint64_t nd, na, nb, nc, nt;
    uint64_t *dims = read_u64s(&r, &nd);
    size_t m = dims[0], n = dims[1], k = dims[2];
    float *a = read_f32s(&r, &na);  /* m x k row-major */
    float *bt = read_f32s(&r, &nb); /* B stored transposed: n x k row-major */
    float *want = read_f32s(&r, &nc);
    float *tol = read_f32s(&r, &nt);
    fclose(r.f);
    /* C with padded rows (row stride n + 3), filled with NaN: beta = 0 must not read it. */
    size_t ldc = n + 3;
    float *c = malloc(m * ldc * sizeof *c);
    for (size_t i = 0; i < m * ldc; i++) c[i] = NAN;
    AttnStatus s = attn_sgemm(1.0f, mat(a, m, k, k, 1), mat(bt, k, n, 1, k), 0.0f,
                              mat_mut(c, m, n, ldc, 1), 1);
    CHECK(s == ATTN_STATUS_OK, "sgemm: %s", attn_status_name(s));
    float *got = calloc(m * n, sizeof *got);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) got[i * n + j] = c[i * ldc + j];
    check_close("sgemm", got, want, tol, m * n);
    for (size_t i = 0; i < m; i++)
        for (size_t j = n; j < ldc; j++) CHECK(isnan(c[i * ldc + j]), "sgemm wrote padding");

    /* Bad arguments. */
    EXPECT_STATUS(attn_sgemm(1, mat(NULL, m, k, k, 1), mat(bt, k, n, 1, k), 0,
                             mat_mut(c, m, n, ldc, 1), 1),
                  ATTN_STATUS_NULL_POINTER);
    EXPECT_STATUS(attn_sgemm(1, mat(a, m, k - 1, k, 1), mat(bt, k, n, 1, k), 0,
                             mat_mut(c, m, n, ldc, 1), 1),
                  ATTN_STATUS_SHAPE_MISMATCH);
    EXPECT_STATUS(attn_sgemm(1, mat(a, m, k, k, 1), mat(bt, k, n, 1, k), 0,
                             mat_mut(c, m, n, 0, 1), 1),
                  ATTN_STATUS_ALIASED_OUTPUT);
    /* C overlapping A: refused before any slice is made. */
    EXPECT_STATUS(attn_sgemm(1, mat(a, 2, 2, 2, 1), mat(bt, 2, 2, 2, 1), 0,
                             mat_mut(a + 1, 2, 2, 2, 1), 1),
                  ATTN_STATUS_ALIASED_OUTPUT);
    EXPECT_STATUS(attn_sgemm(1, mat(a, 3, k, SIZE_MAX / 2, 1), mat(bt, k, n, 1, k), 0,
                             mat_mut(c, 3, n, ldc, 1), 1),
                  ATTN_STATUS_INDEX_OVERFLOW);
    EXPECT_STATUS(attn_sgemm(NAN, mat(a, m, k, k, 1), mat(bt, k, n, 1, k), 0,
                             mat_mut(c, m, n, ldc, 1), 1),
                  ATTN_STATUS_NON_FINITE);
    /* Empty views may be null. */
    EXPECT_STATUS(attn_sgemm(1, mat(NULL, 0, k, k, 1), mat(bt, k, n, 1, k), 0,
                             mat_mut(NULL, 0, n, n, 1), 1),
                  ATTN_STATUS_OK);
    char msg[256];
    attn_sgemm(NAN, mat(a, m, k, k, 1), mat(bt, k, n, 1, k), 0, mat_mut(c, m, n, ldc, 1), 1);
    size_t len = attn_last_error_message(msg, sizeof msg);
    CHECK(len > 0 && strstr(msg, "alpha") != NULL, "last error names alpha: '%s'", msg);
    free(dims), free(a), free(bt), free(want), free(tol), free(c), free(got);
}

/* attention.bin / decode.bin: dims (batch, hq, hkv, nq, nk, dk, dv), q, k, v (bshd),
 * expected o (bshd), bound. Causal mask (default bottom-right offset). The positional entry
 * point against the reference, then attn_attention_run against it bit for bit. */
static void test_attention(const char *dir, const char *file, int decode) {
    Reader r = open_case(dir, file);
    uint64_t nd, nq_, nk_, nv_, no_, nt;
    uint64_t *dims = read_u64s(&r, &nd);
    size_t b = dims[0], hq = dims[1], hkv = dims[2], nq = dims[3], nk = dims[4], dk = dims[5],
           dv = dims[6];
    float *q = read_f32s(&r, &nq_), *k = read_f32s(&r, &nk_), *v = read_f32s(&r, &nv_);
    float *want = read_f32s(&r, &no_), *tol = read_f32s(&r, &nt);
    fclose(r.f);
    float *o = calloc(no_, sizeof *o);
    float *lse = calloc(b * hq * nq, sizeof *lse);
    AttnMask causal = {0};
    causal.kind = ATTN_MASK_KIND_CAUSAL;
    causal.causal_default_offset = true;
    AttnTensor tq = bshd(q, b, nq, hq, dk), tk = bshd(k, b, nk, hkv, dk),
               tv = bshd(v, b, nk, hkv, dv);
    AttnTensorMut to = bshd_mut(o, b, nq, hq, dv);
    float scale = 1.0f / sqrtf((float)dk);
    AttnStatus s = decode ? attn_decode(tq, tk, tv, scale, &causal, to, lse, b * hq * nq, 2)
                          : attn_attention(tq, tk, tv, scale, &causal, to, lse, b * hq * nq, 2);
    CHECK(s == ATTN_STATUS_OK, "%s: %s", file, attn_status_name(s));
    check_close(file, o, want, tol, no_);

    /* The same call through the struct entry point: the same bits. Zero-initialised, then the
     * fields by name; the default scale 1/sqrt(dk) is the one computed in double here. */
    float *o2 = calloc(no_, sizeof *o2), *lse2 = calloc(b * hq * nq, sizeof *lse2);
    float *od = calloc(no_, sizeof *od), *lsed = calloc(b * hq * nq, sizeof *lsed);
    AttnAttentionArgs args = {
        .struct_size = sizeof(AttnAttentionArgs),
        .q = tq,
        .k = tk,
        .v = tv,
        .o = bshd_mut(o2, b, nq, hq, dv),
        .mask = &causal,
        .scale = scale,
        .has_scale = 1,
        .path = decode ? ATTN_PATH_DECODE : ATTN_PATH_AUTO,
        .lse = lse2,
        .lse_len = b * hq * nq,
        .threads = 2,
    };
    EXPECT_STATUS(attn_attention_run(&args), ATTN_STATUS_OK);
    CHECK(memcmp(o, o2, no_ * sizeof *o) == 0, "%s: attn_attention_run output differs", file);
    CHECK(memcmp(lse, lse2, b * hq * nq * sizeof *lse) == 0, "%s: attn_attention_run lse differs",
          file);
    float def = (float)(1.0 / sqrt((double)dk));
    s = decode ? attn_decode(tq, tk, tv, def, &causal, bshd_mut(od, b, nq, hq, dv), lsed,
                             b * hq * nq, 1)
               : attn_attention(tq, tk, tv, def, &causal, bshd_mut(od, b, nq, hq, dv), lsed,
                                b * hq * nq, 1);
    CHECK(s == ATTN_STATUS_OK, "%s: %s", file, attn_status_name(s));
    args.has_scale = 0;
    args.scale = NAN; /* ignored without has_scale */
    args.threads = 0;
    EXPECT_STATUS(attn_attention_run(&args), ATTN_STATUS_OK);
    CHECK(memcmp(od, o2, no_ * sizeof *o) == 0, "%s: default scale output differs", file);
    CHECK(memcmp(lsed, lse2, b * hq * nq * sizeof *lse) == 0, "%s: default scale lse differs",
          file);
    /* The struct's own checks. */
    AttnAttentionArgs bad = args;
    bad.struct_size = sizeof(AttnAttentionArgs) - 1;
    EXPECT_STATUS(attn_attention_run(&bad), ATTN_STATUS_INVALID_PARAMETER);
    char msg[256];
    attn_last_error_message(msg, sizeof msg);
    CHECK(strstr(msg, "args.struct_size") != NULL, "last error names struct_size: '%s'", msg);
    bad = args;
    bad.path = 4;
    EXPECT_STATUS(attn_attention_run(&bad), ATTN_STATUS_INVALID_PARAMETER);
    attn_last_error_message(msg, sizeof msg);
    CHECK(strstr(msg, "args.path") != NULL, "last error names path: '%s'", msg);
    /* f32 operands: widening is a no-op, the vdpbf16ps path is refused, unknown values too. */
    bad = args;
    bad.half_path = ATTN_HALF_PATH_WIDEN;
    EXPECT_STATUS(attn_attention_run(&bad), ATTN_STATUS_OK);
    bad.half_path = ATTN_HALF_PATH_DOT;
    EXPECT_STATUS(attn_attention_run(&bad), ATTN_STATUS_INVALID_PARAMETER);
    bad.half_path = 3;
    EXPECT_STATUS(attn_attention_run(&bad), ATTN_STATUS_INVALID_PARAMETER);
    attn_last_error_message(msg, sizeof msg);
    CHECK(strstr(msg, "args.half_path") != NULL, "last error names half_path: '%s'", msg);
    bad = args;
    bad.has_scale = 1;
    EXPECT_STATUS(attn_attention_run(&bad), ATTN_STATUS_NON_FINITE);
    bad.lse_len += 1;
    bad.has_scale = 0;
    EXPECT_STATUS(attn_attention_run(&bad), ATTN_STATUS_SHAPE_MISMATCH);
    EXPECT_STATUS(attn_attention_run(NULL), ATTN_STATUS_NULL_POINTER);
    free(o2), free(lse2), free(od), free(lsed);

    EXPECT_STATUS(attn_attention(tq, tk, tv, INFINITY, NULL, to, NULL, 0, 1),
                  ATTN_STATUS_NON_FINITE);
    AttnTensor t3 = tq;
    t3.dims[1] = 3; /* 3 query heads over 2 K/V heads */
    AttnTensor k2 = tk;
    k2.dims[1] = 2;
    AttnTensorMut o3 = to;
    o3.dims[1] = 3;
    AttnTensor v2 = tv;
    v2.dims[1] = 2;
    if (hkv >= 2 && hq >= 3)
        EXPECT_STATUS(attn_attention(t3, k2, v2, scale, NULL, o3, NULL, 0, 1),
                      ATTN_STATUS_KV_HEADS_NOT_DIVIDING);
    t3.dims[1] = 0;
    o3.dims[1] = 0;
    EXPECT_STATUS(attn_attention(t3, tk, tv, scale, NULL, o3, NULL, 0, 1),
                  ATTN_STATUS_ZERO_HEADS);
    EXPECT_STATUS(attn_attention(tq, tk, tv, scale, NULL, to, lse, b * hq * nq + 1, 1),
                  ATTN_STATUS_SHAPE_MISMATCH);
    /* The output overlapping the queries. */
    AttnTensorMut alias = {q, {b, hq, nq, dk}, {nq * hq * dk, dk, hq * dk, 1}, 0};
    if (dk == dv)
        EXPECT_STATUS(attn_attention(tq, tk, tv, scale, NULL, alias, NULL, 0, 1),
                      ATTN_STATUS_ALIASED_OUTPUT);
    free(dims), free(q), free(k), free(v), free(want), free(tol), free(o), free(lse);
}

/* mha.bin: dims (batch, n, in_dim, k_dim, v_dim, heads, kv_heads), wq, wk, wv, wo, bq, bk,
 * bv, bo, x, expected y, bound. Self-attention, no mask. */
/* The bf16 bits of a finite f32, rounded to nearest even. */
static uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* `n` floats rounded to bf16 in place (each becomes the value of its bf16); their bits. */
static uint16_t *round_to_bf16(float *v, size_t n) {
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        h[i] = bf16_bits(v[i]);
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&v[i], &u, sizeof u);
    }
    return h;
}

static void test_mha(const char *dir) {
    Reader r = open_case(dir, "mha.bin");
    uint64_t c;
    uint64_t *dims = read_u64s(&r, &c);
    size_t b = dims[0], n = dims[1];
    AttnMhaConfig cfg = {dims[2], dims[2], dims[3], dims[4], dims[5], dims[6]};
    float *wq = read_f32s(&r, &c), *wk = read_f32s(&r, &c), *wv = read_f32s(&r, &c),
          *wo = read_f32s(&r, &c);
    float *bq = read_f32s(&r, &c), *bk = read_f32s(&r, &c), *bv = read_f32s(&r, &c),
          *bo = read_f32s(&r, &c);
    uint64_t ny;
    float *x = read_f32s(&r, &c), *want = read_f32s(&r, &ny), *tol = read_f32s(&r, &c);
    fclose(r.f);
    size_t d = cfg.in_dim, qw = cfg.num_heads * cfg.k_dim, kw = cfg.kv_heads * cfg.k_dim,
           vw = cfg.kv_heads * cfg.v_dim, ow = cfg.num_heads * cfg.v_dim;
    AttnMhaWeights w = {mat(wq, d, qw, qw, 1), mat(wk, d, kw, kw, 1), mat(wv, d, vw, vw, 1),
                        mat(wo, ow, d, d, 1),  bq,  bk, bv, bo};
    AttnTensor tx = bshd(x, b, n, 1, d);
    float *y = calloc(ny, sizeof *y), *y2 = calloc(ny, sizeof *y2);
    /* Allocating form (null workspace). */
    EXPECT_STATUS(attn_mha_forward(&cfg, &w, tx, NULL, bshd_mut(y, b, n, 1, d), NULL, 0, 1),
                  ATTN_STATUS_OK);
    check_close("mha", y, want, tol, ny);
    /* Caller workspace, pre-filled with NaN: the same bits. */
    size_t len = 0;
    EXPECT_STATUS(attn_mha_workspace_len(&cfg, b, n, n, &len), ATTN_STATUS_OK);
    float *ws = malloc(len * sizeof *ws);
    for (size_t i = 0; i < len; i++) ws[i] = NAN;
    EXPECT_STATUS(attn_mha_forward(&cfg, &w, tx, NULL, bshd_mut(y2, b, n, 1, d), ws, len, 2),
                  ATTN_STATUS_OK);
    CHECK(memcmp(y, y2, ny * sizeof *y) == 0, "mha: workspace form differs from allocating");

    EXPECT_STATUS(attn_mha_forward(&cfg, &w, tx, NULL, bshd_mut(y2, b, n, 1, d), ws, len - 1, 1),
                  ATTN_STATUS_OUT_OF_BOUNDS);
    char msg[256];
    attn_last_error_message(msg, sizeof msg);
    CHECK(strstr(msg, "workspace") != NULL, "last error names the workspace: '%s'", msg);
    EXPECT_STATUS(attn_mha_forward(NULL, &w, tx, NULL, bshd_mut(y2, b, n, 1, d), NULL, 0, 1),
                  ATTN_STATUS_NULL_POINTER);
    AttnMhaWeights nw = w;
    nw.wq.data = NULL;
    EXPECT_STATUS(attn_mha_forward(&cfg, &nw, tx, NULL, bshd_mut(y2, b, n, 1, d), NULL, 0, 1),
                  ATTN_STATUS_NULL_POINTER);
    AttnMhaConfig zero = cfg;
    zero.num_heads = 0;
    EXPECT_STATUS(attn_mha_forward(&zero, &w, tx, NULL, bshd_mut(y2, b, n, 1, d), NULL, 0, 1),
                  ATTN_STATUS_ZERO_HEADS);
    AttnMhaConfig gqa = cfg;
    gqa.kv_heads = cfg.num_heads + 1;
    EXPECT_STATUS(attn_mha_forward(&gqa, &w, tx, NULL, bshd_mut(y2, b, n, 1, d), NULL, 0, 1),
                  ATTN_STATUS_KV_HEADS_NOT_DIVIDING);
    AttnMhaConfig wide = cfg;
    wide.k_dim += 1;
    EXPECT_STATUS(attn_mha_forward(&wide, &w, tx, NULL, bshd_mut(y2, b, n, 1, d), NULL, 0, 1),
                  ATTN_STATUS_SHAPE_MISMATCH);
    /* y overlapping the workspace. */
    EXPECT_STATUS(attn_mha_forward(&cfg, &w, tx, NULL, bshd_mut(ws, b, n, 1, d), ws, len, 1),
                  ATTN_STATUS_ALIASED_OUTPUT);
    AttnMhaConfig from;
    EXPECT_STATUS(attn_mha_config_from_embed_dim(10, 3, &from), ATTN_STATUS_HEADS_NOT_DIVISIBLE);
    EXPECT_STATUS(attn_mha_config_from_embed_dim(12, 3, &from), ATTN_STATUS_OK);
    CHECK(from.k_dim == 4 && from.num_heads == 3, "from_embed_dim: k_dim %zu", from.k_dim);
    EXPECT_STATUS(attn_mha_config_from_embed_dim(12, 3, NULL), ATTN_STATUS_NULL_POINTER);

    /* Layer norm: a negative epsilon is out of range; NaN is non-finite. */
    float gamma[4] = {1, 1, 1, 1}, beta[4] = {0, 0, 0, 0}, row[4] = {1, 2, 3, 4}, out[4];
    EXPECT_STATUS(attn_layer_norm(mat(row, 1, 4, 4, 1), gamma, beta, -1.0f,
                                  mat_mut(out, 1, 4, 4, 1)),
                  ATTN_STATUS_INVALID_PARAMETER);
    EXPECT_STATUS(attn_layer_norm(mat(row, 1, 4, 4, 1), gamma, beta, NAN,
                                  mat_mut(out, 1, 4, 4, 1)),
                  ATTN_STATUS_NON_FINITE);
    EXPECT_STATUS(attn_layer_norm(mat(row, 1, 4, 4, 1), gamma, beta, 0.0f,
                                  mat_mut(out, 1, 4, 4, 1)),
                  ATTN_STATUS_OK);
    /* mean 2.5, variance 1.25: (x - 2.5) / sqrt(1.25) */
    CHECK(fabsf(out[0] + 1.3416407f) < 1e-6f && fabsf(out[3] - 1.3416407f) < 1e-6f,
          "layer norm values %g %g", out[0], out[3]);
    /* Typed: bf16 x and weights holding the same values exactly (1, 2, 3, 4; 1; 0), f32 y:
       the same result. An int8 weight type is refused. */
    _Alignas(4) uint16_t row16[4] = {0x3F80, 0x4000, 0x4040, 0x4080};
    uint16_t g16[4] = {0x3F80, 0x3F80, 0x3F80, 0x3F80}, b16[4] = {0, 0, 0, 0};
    float out2[4];
    AttnMat x16 = mat(row16, 1, 4, 4, 1);
    EXPECT_STATUS(attn_layer_norm_typed(x16, ATTN_DTYPE_BF16, g16, b16, ATTN_DTYPE_BF16, 0.0f,
                                        mat_mut(out2, 1, 4, 4, 1), ATTN_DTYPE_F32),
                  ATTN_STATUS_OK);
    CHECK(memcmp(out, out2, sizeof out) == 0, "typed layer norm %g %g", out2[0], out2[3]);
    EXPECT_STATUS(attn_layer_norm_typed(x16, ATTN_DTYPE_BF16, g16, b16, ATTN_DTYPE_Q8, 0.0f,
                                        mat_mut(out2, 1, 4, 4, 1), ATTN_DTYPE_F32),
                  ATTN_STATUS_UNSUPPORTED_DTYPE);
    CHECK(strcmp(attn_status_name(ATTN_STATUS_PANIC), "ATTN_STATUS_PANIC") == 0, "status name");

    /* Softmax of [0, ln 2, ln 3] is [1/6, 2/6, 3/6]; with a causal mask (offset 0) over a
     * 1x3 row only the first key is visible: [1, 0, 0]. */
    float logits[3] = {0.0f, 0.69314718f, 1.09861229f}, p[3], lse = 0;
    AttnTensor tl = {logits, {1, 1, 1, 3}, {3, 3, 3, 1}, 0};
    AttnTensorMut tp = {p, {1, 1, 1, 3}, {3, 3, 3, 1}, 0};
    EXPECT_STATUS(attn_softmax(tl, 1.0f, NULL, tp, &lse, 1, 1), ATTN_STATUS_OK);
    CHECK(fabsf(p[0] - 1.0f / 6) < 1e-6f && fabsf(p[1] - 2.0f / 6) < 1e-6f &&
              fabsf(p[2] - 3.0f / 6) < 1e-6f && fabsf(lse - 1.79175947f) < 1e-6f,
          "softmax %g %g %g lse %g", p[0], p[1], p[2], lse);
    AttnMask causal0 = {0};
    causal0.kind = ATTN_MASK_KIND_CAUSAL;
    EXPECT_STATUS(attn_softmax(tl, 1.0f, &causal0, tp, NULL, 0, 1), ATTN_STATUS_OK);
    CHECK(p[0] == 1.0f && p[1] == 0.0f && p[2] == 0.0f, "causal softmax %g %g %g", p[0], p[1],
          p[2]);
    EXPECT_STATUS(attn_softmax(tl, NAN, NULL, tp, NULL, 0, 1), ATTN_STATUS_NON_FINITE);
    float lse2[2];
    EXPECT_STATUS(attn_softmax(tl, 1.0f, NULL, tp, lse2, 2, 1), ATTN_STATUS_SHAPE_MISMATCH);

    /* bf16 weights and activations through AttnLayerOptions: the f32 layer on the same
     * (rounded) values with its output rounded once to bf16, bit for bit. The f32 arrays
     * become their bf16 values here. */
    float *arrays[9] = {wq, wk, wv, wo, bq, bk, bv, bo, x};
    size_t lens[9] = {d * qw, d * kw, d * vw, ow * d, qw, kw, vw, d, ny};
    uint16_t *h[9];
    for (int i = 0; i < 9; i++) h[i] = round_to_bf16(arrays[i], lens[i]);
    AttnMhaWeights wb = {mat(h[0], d, qw, qw, 1),
                         mat(h[1], d, kw, kw, 1),
                         mat(h[2], d, vw, vw, 1),
                         mat(h[3], ow, d, d, 1),
                         h[4],
                         h[5],
                         h[6],
                         h[7]};
    AttnLayerOptions opt = {0};
    opt.struct_size = sizeof opt;
    opt.weights_dtype = ATTN_DTYPE_BF16;
    opt.activations_dtype = ATTN_DTYPE_BF16;
    uint16_t *yb = calloc(ny, sizeof *yb);
    AttnTensor txb = bshd(h[8], b, n, 1, d);
    AttnTensorMut tyb = bshd_mut(yb, b, n, 1, d);
    EXPECT_STATUS(attn_mha_forward(&cfg, &w, tx, NULL, bshd_mut(y, b, n, 1, d), NULL, 0, 1),
                  ATTN_STATUS_OK);
    EXPECT_STATUS(attn_mha_forward_with_options(&cfg, &wb, NULL, &opt, txb, NULL, tyb, NULL, 0, 1),
                  ATTN_STATUS_OK);
    size_t differ = 0;
    for (size_t i = 0; i < ny; i++) differ += yb[i] != bf16_bits(y[i]);
    CHECK(differ == 0, "bf16 mha: %zu of %zu outputs are not the f32 layer's, rounded", differ,
          (size_t)ny);
    opt.weights_dtype = ATTN_DTYPE_Q8;
    EXPECT_STATUS(attn_mha_forward_with_options(&cfg, &wb, NULL, &opt, txb, NULL, tyb, NULL, 0, 1),
                  ATTN_STATUS_UNSUPPORTED_DTYPE);
    for (int i = 0; i < 9; i++) free(h[i]);
    free(yb);

    free(dims), free(wq), free(wk), free(wv), free(wo), free(bq), free(bk), free(bv), free(bo);
    free(x), free(want), free(tol), free(y), free(y2), free(ws);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DATA_DIR\n", argv[0]);
        return 100;
    }
    test_sgemm(argv[1]);
    test_attention(argv[1], "attention.bin", 0);
    test_attention(argv[1], "decode.bin", 1);
    test_mha(argv[1]);
    if (failures == 0) printf("abi_test: all checks passed\n");
    return failures;
}
