/*
 * The C ABI's boundary from C, run by tests/tests/c_abi.rs (no arguments, no data files):
 * out-of-range enum and bool values, status names for any integer, statuses and messages that
 * name the real fault, absurd thread counts on every entry point that takes one. Exit status:
 * the number of failed checks. With ATTN_NO_TIMING set in the environment (under valgrind),
 * the one-second limit per threaded call is not checked.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn_kernels.h"

#include "check.h"

/* The status of `call` is `want` and, when `needle` is not NULL, the last error message
 * contains it. */
#define EXPECT(call, want, needle)                                                            \
    do {                                                                                      \
        AttnStatus got_ = (call);                                                             \
        CHECK(got_ == (want), "%s: got %s, want %s (%s)", #call, attn_status_name(got_),      \
              attn_status_name(want), last_error());                                          \
        expect_message(#call, needle);                                                        \
    } while (0)

static const char *last_error(void) {
    static char buf[512];
    attn_last_error_message(buf, sizeof buf);
    return buf;
}

/* The last error message contains `needle` (nothing to check for NULL). */
static void expect_message(const char *call, const char *needle) {
    if (needle != NULL)
        CHECK(strstr(last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", call,
              last_error(), needle);
}

static float *vals(size_t n, unsigned seed) {
    float *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = (float)((i * 2654435761u + seed) % 97) / 97.0f - 0.5f;
    return v;
}

static AttnMat mat(const float *data, size_t rows, size_t cols, size_t rs, size_t cs) {
    AttnMat m = {data, rows, cols, rs, cs, 0};
    return m;
}

static AttnMatMut mat_mut(float *data, size_t rows, size_t cols) {
    AttnMatMut m = {data, rows, cols, cols, 1, 0};
    return m;
}

static AttnTensor tensor(const float *data, size_t b, size_t h, size_t s, size_t d) {
    AttnTensor t = {data, {b, h, s, d}, {h * s * d, s * d, d, 1}, 0};
    return t;
}

static AttnTensorMut tensor_mut(float *data, size_t b, size_t h, size_t s, size_t d) {
    AttnTensorMut t = {data, {b, h, s, d}, {h * s * d, s * d, d, 1}, 0};
    return t;
}

/* Additive attention through its versioned struct: with w = 0 every score is 0, so each
 * output row is the mean of the value rows; then a struct_size of 0, a NULL w and a w_len
 * that is not the hidden width. */
static void test_additive(void) {
    const size_t nq = 3, nk = 4, dq = 5, dk = 6, dv = 2, da = 7;
    float *q = vals(nq * dq, 21), *k = vals(nk * dk, 22), *v = vals(nk * dv, 23),
          *o = vals(nq * dv, 24), *wq = vals(dq * da, 25), *wk = vals(dk * da, 26);
    float w[7] = {0};
    AttnAdditiveArgs args = {.struct_size = sizeof args,
                             .q = tensor(q, 1, 1, nq, dq),
                             .k = tensor(k, 1, 1, nk, dk),
                             .v = tensor(v, 1, 1, nk, dv),
                             .o = tensor_mut(o, 1, 1, nq, dv),
                             .wq = mat(wq, dq, da, da, 1),
                             .wk = mat(wk, dk, da, da, 1),
                             .w = w,
                             .w_len = da,
                             .threads = 1};
    EXPECT(attn_additive_attention(&args), ATTN_STATUS_OK, NULL);
    for (size_t i = 0; i < nq; i++) {
        for (size_t d = 0; d < dv; d++) {
            float mean = 0.0f;
            for (size_t j = 0; j < nk; j++) mean += v[j * dv + d] / (float)nk;
            CHECK(fabsf(o[i * dv + d] - mean) < 1e-6f, "additive o[%zu][%zu] = %g, mean %g", i,
                  d, o[i * dv + d], mean);
        }
    }
    AttnAdditiveArgs bad = args;
    bad.struct_size = 0;
    EXPECT(attn_additive_attention(&bad), ATTN_STATUS_INVALID_PARAMETER, "args.struct_size");
    bad = args;
    bad.w = NULL;
    EXPECT(attn_additive_attention(&bad), ATTN_STATUS_NULL_POINTER, "`w`");
    bad = args;
    bad.w_len = da - 1;
    EXPECT(attn_additive_attention(&bad), ATTN_STATUS_SHAPE_MISMATCH, "w");
    free(q), free(k), free(v), free(o), free(wq), free(wk);
}

/* Packed varlen attention, a paged cache write and paged attention through their versioned
 * structs: two sequences of 1 and 2 tokens whose keys are all equal, so each output row is
 * the mean of its sequence's (causally visible) values; then the append of one token to each
 * of two sequences, a write into a slot that both would share, and a struct_size of 0; then
 * paged attention over those pages, and three refused calls. */
static void test_batch(void) {
    const size_t h = 1, d = 2, total = 3;
    float q[6] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}, k[6] = {0}, v[6] = {1, 2, 3, 4, 5, 6};
    float o[6], lse[3];
    size_t cu[3] = {0, 1, 3};
    AttnTensor packed_q = {q, {1, h, total, d}, {0, d, h * d, 1}, 0};
    AttnTensor packed_k = {k, {1, h, total, d}, {0, d, h * d, 1}, 0};
    AttnTensor packed_v = {v, {1, h, total, d}, {0, d, h * d, 1}, 0};
    AttnTensorMut packed_o = {o, {1, h, total, d}, {0, d, h * d, 1}, 0};
    AttnMask causal = {.kind = ATTN_MASK_KIND_CAUSAL, .causal_default_offset = 1};
    AttnVarlenArgs args = {.struct_size = sizeof args,
                           .q = packed_q,
                           .k = packed_k,
                           .v = packed_v,
                           .o = packed_o,
                           .cu_seqlens_q = cu,
                           .cu_seqlens_q_len = 3,
                           .cu_seqlens_k = cu,
                           .cu_seqlens_k_len = 3,
                           .mask = &causal,
                           .lse = lse,
                           .lse_len = 3,
                           .threads = 2};
    EXPECT(attn_varlen_attention(&args), ATTN_STATUS_OK, NULL);
    const float want[6] = {1, 2, 3, 4, 4, 5};
    for (size_t i = 0; i < 6; i++)
        CHECK(fabsf(o[i] - want[i]) < 1e-6f, "varlen o[%zu] = %g, want %g", i, o[i], want[i]);
    CHECK(fabsf(lse[2] - logf(2.0f)) < 1e-6f, "varlen lse[2] = %g", lse[2]);
    AttnVarlenArgs bad = args;
    bad.struct_size = 0;
    EXPECT(attn_varlen_attention(&bad), ATTN_STATUS_INVALID_PARAMETER, "args.struct_size");
    bad = args;
    bad.cu_seqlens_k = NULL;
    EXPECT(attn_varlen_attention(&bad), ATTN_STATUS_NULL_POINTER, "`cu_seqlens_k`");
    size_t decreasing[3] = {0, 2, 1};
    bad = args;
    bad.cu_seqlens_q = decreasing;
    EXPECT(attn_varlen_attention(&bad), ATTN_STATUS_INVALID_PARAMETER, "cu_seqlens_q");

    /* Pools of 2 pages of 16 slots, one head, dk = dv = 1. */
    float kp[32] = {0}, vp[32] = {0}, nk[2] = {7, 8}, nv[2] = {9, 10};
    uint32_t table[2] = {1, 0};
    size_t lens[2] = {4, 0}, cu_new[3] = {0, 1, 2};
    AttnAppendKvArgs app = {.struct_size = sizeof app,
                            .k_pool = kp,
                            .k_pool_len = 32,
                            .v_pool = vp,
                            .v_pool_len = 32,
                            .page_size = 16,
                            .kv_heads = 1,
                            .dk = 1,
                            .dv = 1,
                            .block_table = table,
                            .block_table_len = 2,
                            .max_pages = 1,
                            .seq_lens = lens,
                            .batch = 2,
                            .cu_seqlens_new = cu_new,
                            .k_new = {nk, {1, 1, 2, 1}, {0, 1, 1, 1}, 0},
                            .v_new = {nv, {1, 1, 2, 1}, {0, 1, 1, 1}, 0}};
    EXPECT(attn_append_kv(&app), ATTN_STATUS_OK, NULL);
    CHECK(kp[16 + 4] == 7 && vp[16 + 4] == 9 && kp[0] == 8 && vp[0] == 10,
          "append: k %g %g, v %g %g", kp[20], kp[0], vp[20], vp[0]);
    uint32_t shared[2] = {1, 1};
    AttnAppendKvArgs bad_app = app;
    bad_app.block_table = shared;
    lens[0] = 0;
    EXPECT(attn_append_kv(&bad_app), ATTN_STATUS_INVALID_PARAMETER, "block_table");
    bad_app = app;
    bad_app.struct_size = 0;
    EXPECT(attn_append_kv(&bad_app), ATTN_STATUS_INVALID_PARAMETER, "args.struct_size");

    /* Paged attention over the pools just written: sequence 0 holds 5 keys in page 1 (values
     * 0, 0, 0, 0, 9), sequence 1 one key in page 0 (value 10). The queries are zero, so every
     * score is 0 and each output is the mean of its sequence's values. */
    size_t plens[2] = {5, 1}, pcu[3] = {0, 1, 2};
    float pq[2] = {0, 0}, po[2], plse[2];
    AttnPagedArgs pa = {.struct_size = sizeof pa,
                        .q = {pq, {1, 1, 2, 1}, {0, 1, 1, 1}, 0},
                        .o = {po, {1, 1, 2, 1}, {0, 1, 1, 1}, 0},
                        .cu_seqlens_q = pcu,
                        .k_pool = kp,
                        .k_pool_len = 32,
                        .v_pool = vp,
                        .v_pool_len = 32,
                        .page_size = 16,
                        .kv_heads = 1,
                        .dk = 1,
                        .dv = 1,
                        .block_table = table,
                        .block_table_len = 2,
                        .max_pages = 1,
                        .seq_lens = plens,
                        .batch = 2,
                        .mask = &causal,
                        .lse = plse,
                        .lse_len = 2,
                        .threads = 2};
    EXPECT(attn_paged_attention(&pa), ATTN_STATUS_OK, NULL);
    CHECK(fabsf(po[0] - 9.0f / 5.0f) < 1e-6f && po[1] == 10.0f, "paged o = %g %g", po[0], po[1]);
    CHECK(fabsf(plse[0] - logf(5.0f)) < 1e-6f && plse[1] == 0.0f, "paged lse = %g %g", plse[0],
          plse[1]);
    AttnPagedArgs bad_pa = pa;
    bad_pa.struct_size = 0;
    EXPECT(attn_paged_attention(&bad_pa), ATTN_STATUS_INVALID_PARAMETER, "args.struct_size");
    uint32_t far[2] = {1, 5};
    bad_pa = pa;
    bad_pa.block_table = far;
    EXPECT(attn_paged_attention(&bad_pa), ATTN_STATUS_OUT_OF_BOUNDS, "block_table");
    bad_pa = pa;
    bad_pa.v_pool = NULL;
    EXPECT(attn_paged_attention(&bad_pa), ATTN_STATUS_NULL_POINTER, "`v_pool`");

    /* The same append and attention with int8 keys (one scale per slot: dk = 1) and f16
     * values (version 2 of both structs): key 7 is stored as 127 with scale 7/127, values 9
     * and 10 as their f16 bits; the outputs are those of the f32 pools. */
    int8_t kq[32] = {0};
    float ks[32] = {0};
    uint16_t vh[32] = {0};
    lens[0] = 4;
    AttnAppendKvArgs tapp = app;
    tapp.k_pool = kq;
    tapp.v_pool = vh;
    tapp.k_dtype = ATTN_DTYPE_Q8;
    tapp.v_dtype = ATTN_DTYPE_F16;
    tapp.k_scales = ks;
    tapp.k_scales_len = 32;
    EXPECT(attn_append_kv(&tapp), ATTN_STATUS_OK, NULL);
    CHECK(kq[20] == 127 && kq[0] == 127 && ks[20] == 7.0f / 127.0f && vh[20] == 0x4880 &&
              vh[0] == 0x4900,
          "typed append: k %d %d scale %g, v %x %x", kq[20], kq[0], ks[20], vh[20], vh[0]);
    AttnAppendKvArgs bad_tapp = tapp;
    bad_tapp.k_new_dtype = ATTN_DTYPE_Q8;
    EXPECT(attn_append_kv(&bad_tapp), ATTN_STATUS_UNSUPPORTED_DTYPE, "args.k_new_dtype");
    AttnPagedArgs tpa = pa;
    tpa.k_pool = kq;
    tpa.v_pool = vh;
    tpa.k_dtype = ATTN_DTYPE_Q8;
    tpa.v_dtype = ATTN_DTYPE_F16;
    tpa.k_scales = ks;
    tpa.k_scales_len = 32;
    po[0] = po[1] = NAN;
    EXPECT(attn_paged_attention(&tpa), ATTN_STATUS_OK, NULL);
    CHECK(fabsf(po[0] - 9.0f / 5.0f) < 1e-6f && po[1] == 10.0f, "typed paged o = %g %g", po[0],
          po[1]);
    tpa.k_scales_len = 31;
    EXPECT(attn_paged_attention(&tpa), ATTN_STATUS_SHAPE_MISMATCH, "k_scales");
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_status_names(void) {
    CHECK(strcmp(attn_status_name(ATTN_STATUS_OK), "ATTN_STATUS_OK") == 0, "OK name");
    CHECK(strcmp(attn_status_name(ATTN_STATUS_PANIC), "ATTN_STATUS_PANIC") == 0, "PANIC name");
    CHECK(strcmp(attn_status_name(ATTN_STATUS_NULL_POINTER), "ATTN_STATUS_NULL_POINTER") == 0,
          "NULL_POINTER name");
    const int32_t bad[] = {13, 14, -1, 1000, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *n = attn_status_name(bad[i]);
        CHECK(n != NULL && strcmp(n, "unknown status") == 0, "status %d: '%s'", (int)bad[i],
              n ? n : "(null)");
    }
}

/* Mask kinds 4, 7, 9 (and others) through softmax, attention, decode and attn_attention_run;
 * the same values as AttnAttentionArgs.path, has_scale values 2 to 6; a causal flag of 2;
 * keep-mask bytes other than 0/1. */
static void test_mask_fields(void) {
    float *x = vals(2 * 3, 1), *y = vals(2 * 3, 2);
    float *q = vals(2 * 4, 3), *k = vals(3 * 4, 4), *v = vals(3 * 4, 5), *o = vals(2 * 4, 6);
    AttnTensor tx = tensor(x, 1, 1, 2, 3), tq = tensor(q, 1, 1, 2, 4), tk = tensor(k, 1, 1, 3, 4),
               tv = tensor(v, 1, 1, 3, 4);
    AttnTensorMut ty = tensor_mut(y, 1, 1, 2, 3), to = tensor_mut(o, 1, 1, 2, 4);
    const int32_t kinds[] = {4, 7, 9, -1, INT32_MAX};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
        AttnMask m;
        memset(&m, 0, sizeof m);
        m.kind = kinds[i];
        EXPECT(attn_softmax(tx, 1.0f, &m, ty, NULL, 0, 1), ATTN_STATUS_INVALID_PARAMETER,
               "mask.kind");
        EXPECT(attn_attention(tq, tk, tv, 0.5f, &m, to, NULL, 0, 1),
               ATTN_STATUS_INVALID_PARAMETER, "mask.kind");
        EXPECT(attn_decode(tq, tk, tv, 0.5f, &m, to, NULL, 0, 1), ATTN_STATUS_INVALID_PARAMETER,
               "mask.kind");
        AttnAttentionArgs args = {
            .struct_size = sizeof args, .q = tq, .k = tk, .v = tv, .o = to, .mask = &m};
        EXPECT(attn_attention_run(&args), ATTN_STATUS_INVALID_PARAMETER, "mask.kind");
        /* The struct's own enum and bool fields. */
        args.mask = NULL;
        args.path = kinds[i];
        EXPECT(attn_attention_run(&args), ATTN_STATUS_INVALID_PARAMETER, "args.path");
        args.path = ATTN_PATH_DECODE;
        args.has_scale = (uint8_t)(2 + i);
        EXPECT(attn_attention_run(&args), ATTN_STATUS_INVALID_PARAMETER, "args.has_scale");
        args.has_scale = 1;
        args.scale = 0.5f;
        EXPECT(attn_attention_run(&args), ATTN_STATUS_OK, NULL);
    }
    AttnMask causal;
    memset(&causal, 0, sizeof causal);
    causal.kind = ATTN_MASK_KIND_CAUSAL;
    causal.causal_default_offset = 1;
    EXPECT(attn_attention(tq, tk, tv, 0.5f, &causal, to, NULL, 0, 1), ATTN_STATUS_OK, NULL);
    causal.causal_default_offset = 2;
    EXPECT(attn_attention(tq, tk, tv, 0.5f, &causal, to, NULL, 0, 1),
           ATTN_STATUS_INVALID_PARAMETER, "mask.causal_default_offset");
    EXPECT(attn_softmax(tx, 1.0f, &causal, ty, NULL, 0, 1), ATTN_STATUS_INVALID_PARAMETER,
           "mask.causal_default_offset");

    /* keep over [1, 1, 2, 3] with a padded row (row stride 4): byte 3 is a gap. */
    uint8_t keep[8] = {1, 0, 1, 0, 1, 1, 0, 0};
    AttnMask km;
    memset(&km, 0, sizeof km);
    km.kind = ATTN_MASK_KIND_KEEP;
    km.keep = keep;
    size_t dims[4] = {1, 1, 2, 3}, strides[4] = {8, 8, 4, 1};
    memcpy(km.dims, dims, sizeof dims);
    memcpy(km.strides, strides, sizeof strides);
    EXPECT(attn_softmax(tx, 1.0f, &km, ty, NULL, 0, 1), ATTN_STATUS_OK, NULL);
    CHECK(y[1] == 0.0f && y[5] == 0.0f, "keep 0 masks: %g %g", y[1], y[5]);
    keep[2] = 2;
    EXPECT(attn_softmax(tx, 1.0f, &km, ty, NULL, 0, 1), ATTN_STATUS_INVALID_PARAMETER,
           "mask.keep");
    keep[2] = 1;
    keep[3] = 255; /* in the gap between the rows: still inside the span, refused */
    EXPECT(attn_softmax(tx, 1.0f, &km, ty, NULL, 0, 1), ATTN_STATUS_INVALID_PARAMETER,
           "mask.keep");
    keep[3] = 0;
    km.dims[3] = 4; /* the mask must match the scores: [1, 1, 2, 4] is wrong for nk = 3 */
    EXPECT(attn_attention(tq, tk, tv, 0.5f, &km, to, NULL, 0, 1), ATTN_STATUS_SHAPE_MISMATCH,
           NULL);
    km.dims[2] = 2, km.dims[3] = 3;
    EXPECT(attn_attention(tq, tk, tv, 0.5f, &km, to, NULL, 0, 1), ATTN_STATUS_OK, NULL);
    keep[4] = 7;
    EXPECT(attn_decode(tq, tk, tv, 0.5f, &km, to, NULL, 0, 1), ATTN_STATUS_INVALID_PARAMETER,
           "mask.keep");
    free(x), free(y), free(q), free(k), free(v), free(o);
}

static AttnMhaWeights mha_weights(const float *wq, const float *wk, const float *wv,
                                  const float *wo, size_t d) {
    AttnMhaWeights w = {mat(wq, d, d, d, 1), mat(wk, d, d, d, 1), mat(wv, d, d, d, 1),
                        mat(wo, d, d, d, 1), NULL, NULL, NULL, NULL};
    return w;
}

/* Encoder activation 5, the NULL workspace of length 100, the 2^62-element C view, and the
 * aliasing messages. */
static void test_layer_and_view_faults(void) {
    const size_t d = 8, n = 3, ff = 16;
    AttnMhaConfig cfg = {d, d, 4, 4, 2, 2};
    float *wq = vals(d * d, 1), *wk = vals(d * d, 2), *wv = vals(d * d, 3), *wo = vals(d * d, 4);
    float *x = vals(n * d, 5), *y = vals(n * d, 6);
    AttnMhaWeights w = mha_weights(wq, wk, wv, wo, d);
    AttnTensor tx = tensor(x, 1, 1, n, d);
    AttnTensorMut ty = tensor_mut(y, 1, 1, n, d);
    EXPECT(attn_mha_forward(&cfg, &w, tx, NULL, ty, NULL, 100, 1), ATTN_STATUS_NULL_POINTER,
           "workspace");
    EXPECT(attn_mha_forward(&cfg, &w, tx, NULL, ty, NULL, 0, 1), ATTN_STATUS_OK, NULL);

    float *g = vals(d, 7), *b = vals(d, 8), *w1 = vals(d * ff, 9), *w2 = vals(ff * d, 10);
    AttnEncoderWeights ew = {w, g, b, mat(w1, d, ff, ff, 1), NULL, mat(w2, ff, d, d, 1), NULL,
                             g, b};
    AttnEncoderConfig ec = {cfg, ff, 5, 1e-5f};
    size_t len = 0;
    EXPECT(attn_encoder_workspace_len(&ec, 1, n, &len), ATTN_STATUS_INVALID_PARAMETER,
           "cfg.activation");
    EXPECT(attn_encoder_forward(&ec, &ew, tx, NULL, ty, NULL, 0, 1),
           ATTN_STATUS_INVALID_PARAMETER, "cfg.activation");
    ec.activation = -1;
    EXPECT(attn_encoder_forward(&ec, &ew, tx, NULL, ty, NULL, 0, 1),
           ATTN_STATUS_INVALID_PARAMETER, "cfg.activation");
    ec.activation = ATTN_ACTIVATION_GELU_TANH;
    EXPECT(attn_encoder_forward(&ec, &ew, tx, NULL, ty, NULL, 0, 1), ATTN_STATUS_OK, NULL);

    /* C of 2^62 elements (never touched: refused before any slice is made). */
    float *a = vals(16, 11), *bb = vals(16, 12), *c = vals(16, 13);
    size_t big = (size_t)1 << 31;
    AttnMatMut huge = {c, big, big, big, 1, 0};
    EXPECT(attn_sgemm(1, mat(a, big, 0, 0, 1), mat(bb, 0, big, 1, 1), 0, huge, 1),
           ATTN_STATUS_INDEX_OVERFLOW, "`c`");
    /* C overlapping A, then B: the message names the pair. */
    EXPECT(attn_sgemm(1, mat(c, 4, 4, 4, 1), mat(bb, 4, 4, 4, 1), 0, mat_mut(c, 4, 4), 1),
           ATTN_STATUS_ALIASED_OUTPUT, "`c` overlaps argument `a`");
    EXPECT(attn_sgemm(1, mat(a, 4, 4, 4, 1), mat(c + 2, 2, 2, 2, 1), 0, mat_mut(c, 4, 2), 1),
           ATTN_STATUS_ALIASED_OUTPUT, "`c` overlaps argument `b`");
    /* In-place softmax: y is exactly x. */
    EXPECT(attn_softmax(tensor(c, 1, 1, 4, 4), 1.0f, NULL, tensor_mut(c, 1, 1, 4, 4), NULL, 0, 1),
           ATTN_STATUS_OK, NULL);
    float sum = c[0] + c[1] + c[2] + c[3];
    CHECK(fabsf(sum - 1.0f) < 1e-5f, "in-place softmax row sums to %g", sum);
    /* lse inside y. */
    EXPECT(attn_softmax(tensor(a, 1, 1, 4, 4), 1.0f, NULL, tensor_mut(c, 1, 1, 4, 4), c + 4, 4, 1),
           ATTN_STATUS_ALIASED_OUTPUT, "`y` overlaps argument `lse`");
    /* The workspace inside the input. */
    EXPECT(attn_mha_forward(&cfg, &w, tx, NULL, ty, x, n * d, 1), ATTN_STATUS_ALIASED_OUTPUT,
           "`workspace` overlaps argument `x1`");
    free(wq), free(wk), free(wv), free(wo), free(x), free(y), free(g), free(b), free(w1),
        free(w2), free(a), free(bb), free(c);
}

static int timing = 1;

#define TIMED(call)                                                                           \
    do {                                                                                      \
        double t0_ = now();                                                                   \
        AttnStatus s_ = (call);                                                               \
        double dt_ = now() - t0_;                                                             \
        CHECK(s_ == ATTN_STATUS_OK, "%s: %s (%s)", #call, attn_status_name(s_), last_error()); \
        CHECK(!timing || dt_ < 1.0, "%s took %.3f s", #call, dt_);                            \
    } while (0)

/* Every entry point that takes a thread count, with SIZE_MAX and 4096 threads on problems just
 * large enough to be threaded. */
static void test_thread_counts(void) {
    const size_t counts[] = {SIZE_MAX, 4096, 0};
    const size_t m = 160, d = 64, n = 96, ff = 128, nk = 1024;
    float *a = vals(m * m, 1), *b = vals(m * m, 2), *c = vals(m * m, 3);
    float *x = vals(2 * 256 * 256, 4), *y = vals(2 * 256 * 256, 5), *lse = vals(2 * 256, 6);
    float *q = vals(4 * n * d, 7), *k = vals(4 * nk * d, 8), *v = vals(4 * nk * d, 9),
          *o = vals(4 * n * d, 10);
    AttnMhaConfig cfg = {d, d, 16, 16, 4, 4};
    float *wq = vals(d * d, 11), *wk = vals(d * d, 12), *wv = vals(d * d, 13), *wo = vals(d * d, 14);
    float *g = vals(d, 15), *be = vals(d, 16), *w1 = vals(d * ff, 17), *w2 = vals(ff * d, 18);
    float *xs = vals(n * d, 19), *ys = vals(n * d, 20);
    AttnMhaWeights w = mha_weights(wq, wk, wv, wo, d);
    AttnEncoderWeights ew = {w, g, be, mat(w1, d, ff, ff, 1), NULL, mat(w2, ff, d, d, 1), NULL,
                             g, be};
    AttnEncoderConfig ec = {cfg, ff, ATTN_ACTIVATION_RELU, 1e-5f};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        size_t t = counts[i];
        TIMED(attn_sgemm(1, mat(a, m, m, m, 1), mat(b, m, m, m, 1), 0, mat_mut(c, m, m), t));
        TIMED(attn_softmax(tensor(x, 1, 2, 256, 256), 0.5f, NULL, tensor_mut(y, 1, 2, 256, 256),
                           lse, 2 * 256, t));
        TIMED(attn_attention(tensor(q, 1, 4, n, d), tensor(k, 1, 4, n, d), tensor(v, 1, 4, n, d),
                             0.125f, NULL, tensor_mut(o, 1, 4, n, d), NULL, 0, t));
        TIMED(attn_decode(tensor(q, 1, 4, 1, d), tensor(k, 1, 4, nk, d), tensor(v, 1, 4, nk, d),
                          0.125f, NULL, tensor_mut(o, 1, 4, 1, d), NULL, 0, t));
        AttnAttentionArgs args = {.struct_size = sizeof args,
                                  .q = tensor(q, 1, 4, n, d),
                                  .k = tensor(k, 1, 4, n, d),
                                  .v = tensor(v, 1, 4, n, d),
                                  .o = tensor_mut(o, 1, 4, n, d),
                                  .threads = t};
        TIMED(attn_attention_run(&args));
        TIMED(attn_mha_forward(&cfg, &w, tensor(xs, 1, 1, n, d), NULL,
                               tensor_mut(ys, 1, 1, n, d), NULL, 0, t));
        TIMED(attn_cross_attention_forward(&cfg, &w, tensor(xs, 1, 1, n, d),
                                           tensor(x, 1, 1, n / 2, d), NULL,
                                           tensor_mut(ys, 1, 1, n, d), NULL, 0, t));
        TIMED(attn_encoder_forward(&ec, &ew, tensor(xs, 1, 1, n, d), NULL,
                                   tensor_mut(ys, 1, 1, n, d), NULL, 0, t));
    }
    free(a), free(b), free(c), free(x), free(y), free(lse), free(q), free(k), free(v), free(o),
        free(wq), free(wk), free(wv), free(wo), free(g), free(be), free(w1), free(w2), free(xs),
        free(ys);
}

int main(void) {
    timing = getenv("ATTN_NO_TIMING") == NULL;
    test_status_names();
    test_mask_fields();
    test_layer_and_view_faults();
    test_additive();
    test_batch();
    test_thread_counts();
    if (failures == 0) printf("all boundary checks passed\n");
    return failures;
}
