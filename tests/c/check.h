/* The C tests' one assertion: CHECK(cond, printf-style message) counts a failure and says
 * where, without stopping, so one run reports every broken case. Each test's main returns
 * non-zero when `failures` is. Included by exactly one translation unit per program. */
#ifndef ATTN_TESTS_CHECK_H
#define ATTN_TESTS_CHECK_H

#include <stdio.h>

static int failures = 0;

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                              \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, "\n");                                                            \
            failures++;                                                                       \
        }                                                                                     \
    } while (0)

#endif
