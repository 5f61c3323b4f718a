/* contract_c.c — the error contract on the C ABI, under kolo-run: an argument refused on one rank
 * right after a collective completed there fails that same call on every rank, and every call
 * before it returns KOLO_SUCCESS with the right values on every rank (docs/reliability.md,
 * "The error contract").
 *
 *   contract_c TRIALS SEED
 *
 * Each trial builds a communicator (kolo_comm_init_env, whose tuning probe is a collective too),
 * runs 0-4 good collectives whose values it checks, and then one rank (drawn from the seed: every
 * rank draws the same) refuses the next call: a bad dtype, a bad op, overlapping buffers, a root
 * out of range, a count that does not fit, or a count that differs from the other ranks' (a
 * mismatch the others detect). The last good call before it is often a broadcast rooted at the
 * refusing rank, so that rank returns while the others are still copying: the window in which an
 * error used to fail the earlier call. Every rank prints "KOLO_CONTRACT_PASS rank=R" when all its
 * trials held. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kolo/c/kolo.h>

static int g_rank = -1;
static int g_failures = 0;

static void failf(int trial, const char* what, kolo_result_t rc) {
  fprintf(stderr, "contract_c: rank %d, trial %d: %s (result %d: %s; last error: %s)\n", g_rank,
          trial, what, (int)rc, kolo_get_error_string(rc), kolo_get_last_error());
  ++g_failures;
}

/* The same stream of draws on every rank. */
static uint64_t g_state;
static uint64_t draw(void) {
  g_state ^= g_state << 13;
  g_state ^= g_state >> 7;
  g_state ^= g_state << 17;
  return g_state;
}
static int draw_below(int n) {
  return (int)(draw() % (uint64_t)n);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { kMaxCount = 1 << 18 };
enum kind { BAD_DTYPE, BAD_OP, OVERLAP, BAD_ROOT, BAD_COUNT, MISMATCH, KINDS };
static const char* const kind_names[KINDS] = {"bad dtype", "bad op",    "overlap",
                                              "bad root",  "bad count", "mismatch"};

/* One good collective; its values checked. Returns 0 when it held. */
static int good_call(kolo_comm_t comm, int trial, int size, int32_t* a, int32_t* b, int refuser,
                     int last) {
  const int which = last ? 0 : draw_below(4);
  const size_t n = 1 + (size_t)draw_below(last ? kMaxCount : 4096);
  kolo_result_t rc;
  size_t i;
  if (which == 0) { /* a broadcast from the refusing rank: it returns first */
    for (i = 0; i < n; ++i) a[i] = g_rank == refuser ? (int32_t)(i * 7 + (size_t)trial) : -1;
    rc = kolo_broadcast(a, n, KOLO_INT32, refuser, comm);
    if (rc != KOLO_SUCCESS) return failf(trial, "a good broadcast failed", rc), 1;
    for (i = 0; i < n; ++i) {
      if (a[i] != (int32_t)(i * 7 + (size_t)trial)) {
        return failf(trial, "a good broadcast delivered a wrong value", rc), 1;
      }
    }
  } else if (which == 1) {
    for (i = 0; i < n; ++i) a[i] = (int32_t)((size_t)g_rank + i % 100);
    rc = kolo_allreduce(a, b, n, KOLO_INT32, KOLO_SUM, comm);
    if (rc != KOLO_SUCCESS) return failf(trial, "a good allreduce failed", rc), 1;
    for (i = 0; i < n; ++i) {
      const int32_t want = (int32_t)(size * (size - 1) / 2 + size * (int)(i % 100));
      if (b[i] != want) return failf(trial, "a good allreduce returned a wrong sum", rc), 1;
    }
  } else if (which == 2) {
    rc = kolo_barrier(comm);
    if (rc != KOLO_SUCCESS) return failf(trial, "a good barrier failed", rc), 1;
  } else {
    const size_t m = n < 1024 ? n : 1024;
    for (i = 0; i < m; ++i) a[i] = g_rank * 1000 + (int32_t)i;
    rc = kolo_allgather(a, b, m, KOLO_INT32, comm);
    if (rc != KOLO_SUCCESS) return failf(trial, "a good allgather failed", rc), 1;
    for (i = 0; i < m * (size_t)size; ++i) {
      if (b[i] != (int32_t)(i / m) * 1000 + (int32_t)(i % m)) {
        return failf(trial, "a good allgather delivered a wrong value", rc), 1;
      }
    }
  }
  return 0;
}

/* The refused call (on the refusing rank) or the matching good call (on the others). */
static kolo_result_t last_call(kolo_comm_t comm, enum kind k, int refusing, int size, int32_t* a,
                               int32_t* b) {
  const size_t n = 64;
  size_t counts[64];
  int p;
  switch (k) {
    case BAD_DTYPE:
      return kolo_allreduce(a, b, n, refusing ? (kolo_dtype_t)99 : KOLO_INT32, KOLO_SUM, comm);
    case BAD_OP:
      return kolo_allreduce(a, b, n, KOLO_INT32, refusing ? (kolo_op_t)99 : KOLO_SUM, comm);
    case OVERLAP:
      return kolo_allreduce(a, refusing ? a + 1 : b, n, KOLO_INT32, KOLO_SUM, comm);
    case BAD_ROOT:
      return kolo_broadcast(a, n, KOLO_INT32, refusing ? size + 3 : 0, comm);
    case BAD_COUNT:
      for (p = 0; p < size; ++p) counts[p] = n;
      return kolo_allgatherv(a, refusing ? n + 1 : n, b, counts, KOLO_INT32, comm);
    case MISMATCH:
      return kolo_allreduce(a, b, refusing ? n + 5 : n, KOLO_INT32, KOLO_SUM, comm);
    case KINDS:
      break;
  }
  return KOLO_ERR_INTERNAL;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: contract_c TRIALS SEED\n");
    return 2;
  }
  const int trials = atoi(argv[1]);
  const uint64_t seed = (uint64_t)strtoull(argv[2], NULL, 10);
  const char* timeout_env = getenv("KOLO_TIMEOUT_SECONDS");
  const double timeout = timeout_env ? atof(timeout_env) : 30.0;
  int32_t* a = malloc(sizeof(int32_t) * kMaxCount * 8);
  int32_t* b = malloc(sizeof(int32_t) * kMaxCount * 8);
  int size = 0, t, per_kind[KINDS] = {0};
  double slowest = 0;
  if (a == NULL || b == NULL) return 2;
  for (t = 0; t < trials; ++t) {
    kolo_comm_t comm = NULL;
    kolo_result_t rc = kolo_comm_init_env(&comm);
    if (rc != KOLO_SUCCESS) {
      failf(t, "kolo_comm_init_env failed", rc);
      break;
    }
    kolo_comm_rank(comm, &g_rank);
    kolo_comm_size(comm, &size);
    g_state = seed * 1000003u + (uint64_t)t * 7919u + 1u;
    {
      const int refuser = draw_below(size);
      const enum kind k = (enum kind)draw_below(KINDS);
      const int pre = draw_below(5); /* 0: refused right after kolo_comm_init_env */
      int i, bad = 0;
      char tag[32];
      double began, took;
      for (i = 0; i < pre && !bad; ++i) bad = good_call(comm, t, size, a, b, refuser, i == pre - 1);
      if (bad) {
        kolo_comm_destroy(comm);
        break;
      }
      began = now_s();
      rc = last_call(comm, k, g_rank == refuser, size, a, b);
      took = now_s() - began;
      if (took > slowest) slowest = took;
      ++per_kind[k];
      snprintf(tag, sizeof tag, "[reported by rank %d]", refuser);
      {
        const kolo_result_t want = k == MISMATCH ? KOLO_ERR_MISMATCH : KOLO_ERR_INVALID_ARGUMENT;
        char what[160];
        snprintf(what, sizeof what, "the refused call (%s on rank %d) returned the wrong result",
                 kind_names[k], refuser);
        if (rc != want) {
          failf(t, what, rc);
        } else if (k != MISMATCH && g_rank != refuser &&
                   strstr(kolo_get_last_error(), tag) == NULL) {
          snprintf(what, sizeof what, "the refused call's error (%s) does not name rank %d",
                   kind_names[k], refuser);
          failf(t, what, rc);
        } else if (took > timeout / 10) {
          snprintf(what, sizeof what, "the refused call (%s) took %.3f s, a tenth of the deadline",
                   kind_names[k], took);
          failf(t, what, rc);
        }
      }
      /* Every later call returns the same kind of failure: the communicator is unusable. */
      if (kolo_barrier(comm) == KOLO_SUCCESS) failf(t, "a barrier after the failure succeeded", 0);
    }
    kolo_comm_destroy(comm);
    if (g_failures > 0) break;
  }
  free(a);
  free(b);
  if (g_failures > 0) return 1;
  printf(
      "KOLO_CONTRACT_PASS rank=%d trials=%d (dtype %d, op %d, overlap %d, root %d, count %d, "
      "mismatch %d) slowest refused call %.1f ms\n",
      g_rank, trials, per_kind[0], per_kind[1], per_kind[2], per_kind[3], per_kind[4], per_kind[5],
      slowest * 1e3);
  return 0;
}
