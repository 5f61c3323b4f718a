/* c_api_test — kolo's C ABI used from C11, the way another language's binding uses it.
 *
 * Compiled as C (no C++ flags) and linked against libkolo_c.so (or libkolo_c_static.a). Every
 * rank runs the same mode under kolo-run and checks every value it receives exactly:
 *
 *   collectives  allreduce (every dtype, every op, in and out of place), allgather(v),
 *                broadcast from every root, reduce_scatter, alltoall, barrier, then the engine
 *                (allreduce, allgather with uneven counts, broadcast by name; test/wait/free)
 *   explicit     the same collectives through kolo_comm_init(rank, size, KOLO_STORE, secret)
 *   local        no launcher needed: version, error strings, NULL handles, bad init arguments,
 *                a bad KOLO_* variable (KOLO_ERR_CONFIG), bad dtype/op at one rank
 *   bad-dtype    rank 0 passes an unknown dtype: KOLO_ERR_INVALID_ARGUMENT on every rank
 *   mismatch     rank 0 reduces 4 elements, the others 5: KOLO_ERR_MISMATCH on every rank
 *   overflow     an allgather whose size x count wraps size_t: KOLO_ERR_INVALID_ARGUMENT naming
 *                the count and element size on every rank
 *   dead-peer    the last rank exits without a word: KOLO_ERR_PEER_LOST on the others
 *   abort        the last rank calls kolo_comm_abort: KOLO_ERR_PEER_LOST on the others
 *   shrink       the last rank exits without a word; the others get KOLO_ERR_PEER_LOST, call
 *                kolo_comm_shrink and run an exact allreduce on the smaller communicator; then
 *                rank 0 revokes it (kolo_comm_revoke) after a second allreduce: the others'
 *                may complete or fail, their next call returns KOLO_ERR_REVOKED
 *   timeout      rank 0 waits in an allreduce that rank 1 joins too late (KOLO_TIMEOUT_SECONDS):
 *                KOLO_ERR_TIMEOUT on both (on rank 1 at its allreduce or its next call)
 *   engine-mismatch  ranks submit one name with different counts: KOLO_ERR_MISMATCH on wait
 *   grow         rank 0 starts this program in mode "join" (the ranks' environment less
 *                the launcher's per-rank KOLO_RANK, KOLO_SIZE, KOLO_LOCAL_RANK and so on); the
 *                members call kolo_comm_grow(1) and the new process kolo_comm_join: all check
 *                rank, size and an exact allreduce on the enlarged communicator, then a second
 *                grow with the used token returns KOLO_ERR_CONFIG on every rank; rank 0 reaps
 *                the joiner (exit status 0)
 *
 * Every failure path also checks that a message came with the code, that the process is still
 * running (no abort: the exit status would tell kolo-run), and that the communicator then keeps
 * returning the error (see check_fault for when exactly an error reaches each rank). Each rank
 * prints "KOLO_C_PASS rank=R mode=M" and exits 0, or prints what failed and exits 1.
 */
#define _POSIX_C_SOURCE 200809L

#include <kolo/c/kolo.h>

#include <errno.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

static int failures = 0;
static int my_rank = -1;
static const char* mode = "";

#define CHECK(cond)                                                                       \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      fprintf(stderr, "KOLO_C_FAIL rank=%d mode=%s %s:%d: %s\n", my_rank, mode, __FILE__, \
              __LINE__, #cond);                                                           \
      ++failures;                                                                         \
    }                                                                                     \
  } while (0)

/* A call that must succeed; on failure prints the code and the message. */
#define OK(call)                                                                               \
  do {                                                                                         \
    kolo_result_t r_ = (call);                                                                 \
    if (r_ != KOLO_SUCCESS) {                                                                  \
      fprintf(stderr, "KOLO_C_FAIL rank=%d mode=%s %s:%d: %s returned %d (%s): %s\n", my_rank, \
              mode, __FILE__, __LINE__, #call, (int)r_, kolo_get_error_string(r_),             \
              kolo_get_last_error());                                                          \
      ++failures;                                                                              \
    }                                                                                          \
  } while (0)

/* A call that must fail with `code`, leave a message containing `needle`, and not abort. */
static void expect_error(kolo_result_t got, kolo_result_t code, const char* needle,
                         const char* what, int line) {
  const char* msg = kolo_get_last_error();
  if (got != code) {
    fprintf(stderr,
            "KOLO_C_FAIL rank=%d mode=%s line %d: %s returned %d (%s), expected %d (%s): %s\n",
            my_rank, mode, line, what, (int)got, kolo_get_error_string(got), (int)code,
            kolo_get_error_string(code), msg);
    ++failures;
    return;
  }
  if (msg == NULL || msg[0] == '\0' || (needle != NULL && strstr(msg, needle) == NULL)) {
    fprintf(stderr, "KOLO_C_FAIL rank=%d mode=%s line %d: %s: message '%s' lacks '%s'\n", my_rank,
            mode, line, what, msg ? msg : "(null)", needle ? needle : "");
    ++failures;
    return;
  }
  printf("rank %d: %s -> %s: %s\n", my_rank, what, kolo_get_error_string(got), msg);
}
#define EXPECT_ERROR(call, code, needle) expect_error((call), (code), (needle), #call, __LINE__)

static void sleep_ms(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* float16 / bfloat16 bit patterns of the small integers the tests reduce (1..10). */
static uint16_t fp16_of(int v) {
  static const uint16_t t[] = {0x0000, 0x3C00, 0x4000, 0x4200, 0x4400, 0x4500,
                               0x4600, 0x4700, 0x4800, 0x4880, 0x4900};
  return t[v];
}
static uint16_t bf16_of(int v) {
  const float f = (float)v;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)(u >> 16);
}

/* ------------------------------------------------------------------ collectives */

static void check_allreduce(kolo_comm_t comm, int rank, int size) {
  /* float32 sum, out of place, an odd count; then in place on a count the ring pipelines. */
  {
    enum { n = 1037 };
    static float in[n], out[n];
    for (int i = 0; i < n; ++i) in[i] = (float)(rank * 1000 + i);
    OK(kolo_allreduce(in, out, n, KOLO_FLOAT32, KOLO_SUM, comm));
    int bad = 0;
    for (int i = 0; i < n; ++i) {
      if (out[i] != (float)(1000 * size * (size - 1) / 2 + size * i)) ++bad;
      if (in[i] != (float)(rank * 1000 + i)) ++bad; /* the input is read-only */
    }
    CHECK(bad == 0);
  }
  {
    const size_t n = 300000;
    float* buf = malloc(n * sizeof *buf);
    CHECK(buf != NULL);
    if (buf) {
      for (size_t i = 0; i < n; ++i) buf[i] = (float)(rank + 1) * (float)(i % 1000);
      OK(kolo_allreduce(buf, buf, n, KOLO_FLOAT32, KOLO_SUM, comm));
      int bad = 0;
      for (size_t i = 0; i < n; ++i) {
        if (buf[i] != (float)(size * (size + 1) / 2) * (float)(i % 1000)) ++bad;
      }
      CHECK(bad == 0);
      free(buf);
    }
  }
  /* float64 average in place: (n-1) + i exactly. */
  {
    double d[9];
    for (int i = 0; i < 9; ++i) d[i] = 2.0 * rank + i;
    OK(kolo_allreduce(d, d, 9, KOLO_FLOAT64, KOLO_AVERAGE, comm));
    for (int i = 0; i < 9; ++i) CHECK(d[i] == (double)(size - 1) + i);
  }
  /* int32 max and min, int64 product, uint8 sum, int8 min. */
  {
    int32_t a[6], mx[6], mn[6];
    for (int i = 0; i < 6; ++i) a[i] = (int32_t)((rank * 7 + i * 3) % 11) - 5;
    OK(kolo_allreduce(a, mx, 6, KOLO_INT32, KOLO_MAX, comm));
    OK(kolo_allreduce(a, mn, 6, KOLO_INT32, KOLO_MIN, comm));
    for (int i = 0; i < 6; ++i) {
      int32_t emax = -1000, emin = 1000;
      for (int r = 0; r < size; ++r) {
        const int32_t v = (int32_t)((r * 7 + i * 3) % 11) - 5;
        if (v > emax) emax = v;
        if (v < emin) emin = v;
      }
      CHECK(mx[i] == emax);
      CHECK(mn[i] == emin);
    }
  }
  {
    int64_t p[3] = {rank + 2, -(rank + 1), 1000 + rank};
    OK(kolo_allreduce(p, p, 3, KOLO_INT64, KOLO_PRODUCT, comm));
    int64_t e0 = 1, e1 = 1, e2 = 1;
    for (int r = 0; r < size; ++r) {
      e0 *= r + 2;
      e1 *= -(r + 1);
      e2 *= 1000 + r;
    }
    CHECK(p[0] == e0 && p[1] == e1 && p[2] == e2);
  }
  {
    uint8_t u[5];
    int8_t s[5];
    for (int i = 0; i < 5; ++i) {
      u[i] = (uint8_t)(rank * 10 + i);
      s[i] = (int8_t)(i - rank * 20);
    }
    OK(kolo_allreduce(u, u, 5, KOLO_UINT8, KOLO_SUM, comm));
    OK(kolo_allreduce(s, s, 5, KOLO_INT8, KOLO_MIN, comm));
    for (int i = 0; i < 5; ++i) {
      CHECK(u[i] == (uint8_t)(10 * size * (size - 1) / 2 + size * i));
      CHECK(s[i] == (int8_t)(i - (size - 1) * 20));
    }
  }
  /* float16 and bfloat16: sums of 1..size (exact in both). */
  {
    uint16_t h[4], b[4];
    for (int i = 0; i < 4; ++i) {
      h[i] = fp16_of(rank + 1);
      b[i] = bf16_of(rank + 1);
    }
    OK(kolo_allreduce(h, h, 4, KOLO_FLOAT16, KOLO_SUM, comm));
    OK(kolo_allreduce(b, b, 4, KOLO_BFLOAT16, KOLO_SUM, comm));
    for (int i = 0; i < 4; ++i) {
      CHECK(h[i] == fp16_of(size * (size + 1) / 2));
      CHECK(b[i] == bf16_of(size * (size + 1) / 2));
    }
  }
  /* Zero elements: a no-op that still takes part. */
  OK(kolo_allreduce(NULL, NULL, 0, KOLO_FLOAT32, KOLO_SUM, comm));
}

static void check_gathers(kolo_comm_t comm, int rank, int size) {
  /* allgather, out of place and in place. */
  {
    enum { k = 5 };
    int32_t in[k], out[4 * k];
    for (int i = 0; i < k; ++i) in[i] = rank * 100 + i;
    memset(out, 0, sizeof out);
    OK(kolo_allgather(in, out, k, KOLO_INT32, comm));
    for (int r = 0; r < size; ++r) {
      for (int i = 0; i < k; ++i) CHECK(out[r * k + i] == r * 100 + i);
    }
    int32_t inplace[4 * k];
    for (int i = 0; i < 4 * k; ++i) inplace[i] = -1;
    for (int i = 0; i < k; ++i) inplace[rank * k + i] = rank * 7 + i;
    OK(kolo_allgather(inplace + rank * k, inplace, k, KOLO_INT32, comm));
    for (int r = 0; r < size; ++r) {
      for (int i = 0; i < k; ++i) CHECK(inplace[r * k + i] == r * 7 + i);
    }
  }
  /* allgatherv: rank p contributes p + 1 doubles. */
  {
    size_t counts[4];
    size_t total = 0;
    for (int r = 0; r < size; ++r) {
      counts[r] = (size_t)r + 1;
      total += counts[r];
    }
    double in[4], out[10];
    for (int i = 0; i <= rank; ++i) in[i] = rank + 0.25 * i;
    OK(kolo_allgatherv(in, (size_t)rank + 1, out, counts, KOLO_FLOAT64, comm));
    size_t at = 0;
    for (int r = 0; r < size; ++r) {
      for (int i = 0; i <= r; ++i) CHECK(out[at++] == r + 0.25 * i);
    }
    CHECK(at == total);
  }
  /* broadcast from every root. */
  for (int root = 0; root < size; ++root) {
    double d[7];
    for (int i = 0; i < 7; ++i) d[i] = rank == root ? root * 10.0 + i : -1.0;
    OK(kolo_broadcast(d, 7, KOLO_FLOAT64, root, comm));
    for (int i = 0; i < 7; ++i) CHECK(d[i] == root * 10.0 + i);
  }
  /* reduce_scatter: block p of the sum, out of place then in place. */
  {
    enum { k = 3 };
    float in[4 * k], out[k];
    for (int i = 0; i < size * k; ++i) in[i] = (float)(rank + i);
    OK(kolo_reduce_scatter(in, out, k, KOLO_FLOAT32, KOLO_SUM, comm));
    for (int i = 0; i < k; ++i) {
      const int g = rank * k + i;
      CHECK(out[i] == (float)(size * (size - 1) / 2 + size * g));
    }
    OK(kolo_reduce_scatter(in, in + rank * k, k, KOLO_FLOAT32, KOLO_MAX, comm));
    for (int i = 0; i < k; ++i) CHECK(in[rank * k + i] == (float)(size - 1 + rank * k + i));
  }
  /* alltoall: block j of rank r's input is r*100 + j*10 + i; it lands on rank j as block r. */
  {
    enum { k = 2 };
    int64_t in[4 * k], out[4 * k];
    for (int j = 0; j < size; ++j) {
      for (int i = 0; i < k; ++i) in[j * k + i] = rank * 100 + j * 10 + i;
    }
    OK(kolo_alltoall(in, out, k, KOLO_INT64, comm));
    for (int r = 0; r < size; ++r) {
      for (int i = 0; i < k; ++i) CHECK(out[r * k + i] == r * 100 + rank * 10 + i);
    }
  }
  for (int i = 0; i < 3; ++i) OK(kolo_barrier(comm));
}

/* Waits for a request by polling kolo_request_test (with a deadline), as an event loop would. */
static kolo_result_t poll_request(kolo_request_t req) {
  const double give_up = now_seconds() + 60.0;
  int done = 0;
  for (;;) {
    const kolo_result_t r = kolo_request_test(req, &done);
    if (done || r != KOLO_SUCCESS) return r;
    if (now_seconds() > give_up) {
      fprintf(stderr, "KOLO_C_FAIL rank=%d: request not done after 60 s\n", my_rank);
      ++failures;
      return KOLO_ERR_TIMEOUT;
    }
    sleep_ms(1);
  }
}

static void check_engine(kolo_comm_t comm, int rank, int size) {
  kolo_engine_t engine = NULL;
  OK(kolo_engine_create(&engine, comm));
  if (engine == NULL) return;

  enum { n = 100 };
  float grad[n], summed[n];
  int32_t counts_i[8];
  for (int i = 0; i < n; ++i) grad[i] = (float)(rank + i);
  for (int i = 0; i < 8; ++i) counts_i[i] = rank * 3 - i;
  int64_t ids[4];
  for (int i = 0; i <= rank; ++i) ids[i] = rank * 1000 + i;
  double params[3] = {-1.0, -1.0, -1.0};
  if (rank == size - 1) params[0] = 1.5, params[1] = 2.5, params[2] = 3.5;

  kolo_request_t r_grad = NULL, r_max = NULL, r_ids = NULL, r_params = NULL;
  OK(kolo_engine_allreduce(engine, "grad", grad, summed, n, KOLO_FLOAT32, KOLO_SUM, &r_grad));
  OK(kolo_engine_allreduce(engine, "counts", counts_i, counts_i, 8, KOLO_INT32, KOLO_MAX, &r_max));
  OK(kolo_engine_allgather(engine, "ids", ids, (size_t)rank + 1, KOLO_INT64, &r_ids));
  OK(kolo_engine_broadcast(engine, "params", params, 3, KOLO_FLOAT64, size - 1, &r_params));
  /* The communicator stays usable next to the engine (its own connections). */
  OK(kolo_barrier(comm));

  OK(poll_request(r_grad));
  OK(kolo_request_wait(r_max));
  OK(kolo_request_wait(r_ids));
  OK(poll_request(r_params));
  for (int i = 0; i < n; ++i) CHECK(summed[i] == (float)(size * (size - 1) / 2 + size * i));
  for (int i = 0; i < 8; ++i) CHECK(counts_i[i] == (size - 1) * 3 - i);
  CHECK(params[0] == 1.5 && params[1] == 2.5 && params[2] == 3.5);

  const void* data = NULL;
  size_t count = 0;
  OK(kolo_request_output(r_grad, &data, &count));
  CHECK(data == (const void*)summed && count == n);
  OK(kolo_request_output(r_ids, &data, &count));
  CHECK(count == (size_t)(size * (size + 1) / 2));
  size_t per_rank[4] = {0, 0, 0, 0};
  OK(kolo_request_counts(r_ids, per_rank, 4));
  if (data != NULL) {
    const int64_t* all = (const int64_t*)data;
    size_t at = 0;
    for (int r = 0; r < size; ++r) {
      CHECK(per_rank[r] == (size_t)r + 1);
      for (int i = 0; i <= r; ++i) CHECK(all[at++] == r * 1000 + i);
    }
  }
  EXPECT_ERROR(kolo_request_counts(r_grad, per_rank, 4), KOLO_ERR_INVALID_ARGUMENT,
               "not an allgather");
  kolo_request_free(r_grad);
  kolo_request_free(r_max);
  kolo_request_free(r_ids);
  kolo_request_free(r_params);

  /* Many names in flight at once (fused), then the same names again (the response cache). */
  for (int round = 0; round < 2; ++round) {
    enum { m = 16 };
    static int32_t t[m][10];
    kolo_request_t reqs[m];
    for (int j = 0; j < m; ++j) {
      char name[32];
      snprintf(name, sizeof name, "layer%d", j);
      for (int i = 0; i < 10; ++i) t[j][i] = rank + j + i + round;
      OK(kolo_engine_allreduce(engine, name, t[j], t[j], 10, KOLO_INT32, KOLO_SUM, &reqs[j]));
    }
    for (int j = 0; j < m; ++j) {
      OK(kolo_request_wait(reqs[j]));
      kolo_request_free(reqs[j]);
      for (int i = 0; i < 10; ++i) {
        CHECK(t[j][i] == size * (size - 1) / 2 + size * (j + i + round));
      }
    }
  }

  /* One request for a list of buffers (a bucket), twice (negotiated, then cached): buffers of
   * 1 to 64 doubles, averaged; then its argument errors. */
  for (int round = 0; round < 2; ++round) {
    enum { m = 12 };
    static double b[m][64];
    void* bufs[m];
    size_t counts[m];
    for (int j = 0; j < m; ++j) {
      counts[j] = (size_t)(1 + (j * 13) % 64);
      bufs[j] = b[j];
      for (size_t i = 0; i < counts[j]; ++i) b[j][i] = (double)(rank * 4 + j + (int)i + round);
    }
    kolo_request_t req = NULL;
    OK(kolo_engine_allreduce_coalesced(engine, "bucket", bufs, counts, m, KOLO_FLOAT64,
                                       KOLO_AVERAGE, &req));
    OK(kolo_request_wait(req));
    const void* out = (const void*)1;
    size_t out_count = 7;
    OK(kolo_request_output(req, &out, &out_count));
    CHECK(out == NULL && out_count == 0);
    kolo_request_free(req);
    for (int j = 0; j < m; ++j) {
      for (size_t i = 0; i < counts[j]; ++i) {
        /* the mean of rank * 4 over the ranks is 2 * (size - 1): exact in float64 */
        CHECK(b[j][i] == 2.0 * (size - 1) + j + (int)i + round);
      }
    }
  }
  {
    static float x[8];
    void* bufs[2] = {x, x + 2};
    size_t counts[2] = {4, 4};
    kolo_request_t req = NULL;
    EXPECT_ERROR(kolo_engine_allreduce_coalesced(engine, "bad", bufs, counts, 2, KOLO_FLOAT32,
                                                 KOLO_SUM, &req),
                 KOLO_ERR_INVALID_ARGUMENT, "overlap");
    CHECK(req == NULL);
    EXPECT_ERROR(kolo_engine_allreduce_coalesced(engine, "bad", bufs, counts, 0, KOLO_FLOAT32,
                                                 KOLO_SUM, &req),
                 KOLO_ERR_INVALID_ARGUMENT, "n is 0");
    EXPECT_ERROR(kolo_engine_allreduce_coalesced(engine, "bad", NULL, counts, 2, KOLO_FLOAT32,
                                                 KOLO_SUM, &req),
                 KOLO_ERR_INVALID_ARGUMENT, "bufs is NULL");
  }
  OK(kolo_engine_destroy(engine));
}

static void run_collectives(kolo_comm_t comm) {
  int rank = -1, size = -1, local_rank = -1, local_size = -1;
  OK(kolo_comm_rank(comm, &rank));
  OK(kolo_comm_size(comm, &size));
  OK(kolo_comm_local_rank(comm, &local_rank));
  OK(kolo_comm_local_size(comm, &local_size));
  const char* env_size = getenv("KOLO_SIZE");
  CHECK(size == (env_size ? atoi(env_size) : 1));
  CHECK(rank == my_rank);
  CHECK(size >= 1 && size <= 4);                   /* the fixed-size buffers below hold 4 ranks */
  CHECK(local_size == size && local_rank == rank); /* kolo-run: one host */
  if (failures) return;
  check_allreduce(comm, rank, size);
  check_gathers(comm, rank, size);
  check_engine(comm, rank, size);
}

/* ------------------------------------------------------------------ errors */

static void check_local_errors(void) {
  CHECK(kolo_get_version() == KOLO_VERSION_CODE);
  CHECK(kolo_get_abi_version() == KOLO_C_ABI_VERSION);
  CHECK(strcmp(kolo_get_last_error(), "") == 0); /* nothing has failed yet */
  /* Every code has its own string; an unknown one gets a string too. */
  for (int a = KOLO_SUCCESS; a <= KOLO_ERR_REVOKED; ++a) {
    CHECK(kolo_get_error_string((kolo_result_t)a) != NULL);
    for (int b = KOLO_SUCCESS; b < a; ++b) {
      CHECK(strcmp(kolo_get_error_string((kolo_result_t)a),
                   kolo_get_error_string((kolo_result_t)b)) != 0);
    }
  }
  CHECK(strcmp(kolo_get_error_string((kolo_result_t)77), "unknown kolo result code") == 0);

  /* NULL handles and out-parameters. */
  int v = 0;
  EXPECT_ERROR(kolo_comm_init_env(NULL), KOLO_ERR_INVALID_ARGUMENT, "comm is NULL");
  EXPECT_ERROR(kolo_comm_rank(NULL, &v), KOLO_ERR_INVALID_ARGUMENT, "comm is NULL");
  EXPECT_ERROR(kolo_allreduce(&v, &v, 1, KOLO_INT32, KOLO_SUM, NULL), KOLO_ERR_INVALID_ARGUMENT,
               "comm is NULL");
  EXPECT_ERROR(kolo_barrier(NULL), KOLO_ERR_INVALID_ARGUMENT, "kolo_barrier");
  EXPECT_ERROR(kolo_request_wait(NULL), KOLO_ERR_INVALID_ARGUMENT, "request is NULL");
  EXPECT_ERROR(kolo_engine_create(NULL, NULL), KOLO_ERR_INVALID_ARGUMENT, "engine is NULL");
  OK(kolo_comm_destroy(NULL));
  OK(kolo_comm_abort(NULL));
  OK(kolo_engine_destroy(NULL));
  kolo_request_free(NULL);

  /* kolo_comm_init's arguments; *comm is NULL after each failure. */
  kolo_comm_t comm = (kolo_comm_t)&v;
  EXPECT_ERROR(kolo_comm_init(&comm, 2, 2, "127.0.0.1:1", "0123456789abcdef", 0),
               KOLO_ERR_INVALID_ARGUMENT, "rank 2 is not in 0..1");
  CHECK(comm == NULL);
  EXPECT_ERROR(kolo_comm_init(&comm, 0, 0, NULL, NULL, 0), KOLO_ERR_INVALID_ARGUMENT, "size 0");
  EXPECT_ERROR(kolo_comm_init(&comm, 0, 2, NULL, "0123456789abcdef", 0), KOLO_ERR_INVALID_ARGUMENT,
               "store_address is NULL");
  EXPECT_ERROR(kolo_comm_init(&comm, 0, 2, "no-port-here", "0123456789abcdef", 0),
               KOLO_ERR_INVALID_ARGUMENT, "store_address=no-port-here");
  EXPECT_ERROR(kolo_comm_init(&comm, 0, 2, "127.0.0.1:1", "short", 0), KOLO_ERR_INVALID_ARGUMENT,
               "secret is too short");
  EXPECT_ERROR(kolo_comm_init(&comm, 0, 2, "127.0.0.1:1", "0123456789abcdef", 8u),
               KOLO_ERR_INVALID_ARGUMENT, "flags 8");
  CHECK(comm == NULL);

  /* The environment: a bad knob is KOLO_ERR_CONFIG naming it; no secret for 2 ranks too. */
  setenv("KOLO_TIMEOUT_SECONDS", "banana", 1);
  EXPECT_ERROR(kolo_comm_init_env(&comm), KOLO_ERR_CONFIG, "KOLO_TIMEOUT_SECONDS");
  CHECK(comm == NULL);
  unsetenv("KOLO_TIMEOUT_SECONDS");
  unsetenv("KOLO_SECRET");
  EXPECT_ERROR(kolo_comm_init(&comm, 1, 2, "127.0.0.1:1", NULL, 0), KOLO_ERR_CONFIG, "secret");

  /* A single-rank communicator: values pass through; a bad dtype/op is refused, and the
   * communicator then keeps refusing (kolo's abort semantics, on one rank as on many). */
  OK(kolo_comm_init(&comm, 0, 1, NULL, NULL, 0));
  if (comm == NULL) return;
  float x[3] = {1.0f, 2.0f, 3.0f}, y[3] = {0, 0, 0};
  OK(kolo_allreduce(x, y, 3, KOLO_FLOAT32, KOLO_SUM, comm));
  CHECK(y[0] == 1.0f && y[1] == 2.0f && y[2] == 3.0f);

  /* The engine refuses a bad dtype or op on this rank only, and stays usable. */
  kolo_engine_t engine = NULL;
  kolo_request_t req = (kolo_request_t)&v;
  OK(kolo_engine_create(&engine, comm));
  EXPECT_ERROR(kolo_engine_allreduce(engine, "t", x, x, 3, (kolo_dtype_t)42, KOLO_SUM, &req),
               KOLO_ERR_INVALID_ARGUMENT, "dtype 42");
  CHECK(req == NULL);
  EXPECT_ERROR(kolo_engine_allreduce(engine, "t", x, x, 3, KOLO_FLOAT32, (kolo_op_t)9, &req),
               KOLO_ERR_INVALID_ARGUMENT, "op 9");
  EXPECT_ERROR(kolo_engine_allreduce(engine, NULL, x, x, 3, KOLO_FLOAT32, KOLO_SUM, &req),
               KOLO_ERR_INVALID_ARGUMENT, "name is NULL");
  EXPECT_ERROR(kolo_engine_broadcast(engine, "b", x, 3, KOLO_FLOAT32, 5, &req),
               KOLO_ERR_INVALID_ARGUMENT, "root 5");
  OK(kolo_engine_allreduce(engine, "t", x, x, 3, KOLO_FLOAT32, KOLO_MAX, &req));
  OK(kolo_request_wait(req));
  kolo_request_free(req);
  CHECK(x[0] == 1.0f && x[2] == 3.0f);
  OK(kolo_engine_destroy(engine));

  EXPECT_ERROR(kolo_allreduce(x, y, 3, KOLO_FLOAT32, (kolo_op_t)-1, comm),
               KOLO_ERR_INVALID_ARGUMENT, "op -1 is not a kolo_op_t");
  EXPECT_ERROR(kolo_barrier(comm), KOLO_ERR_INVALID_ARGUMENT, "op -1");
  OK(kolo_comm_destroy(comm));

  OK(kolo_comm_init(&comm, 0, 1, NULL, NULL, 0));
  EXPECT_ERROR(kolo_broadcast(x, 3, (kolo_dtype_t)8, 0, comm), KOLO_ERR_INVALID_ARGUMENT,
               "dtype 8 is not a kolo_dtype_t");
  OK(kolo_comm_destroy(comm));
  OK(kolo_comm_init(&comm, 0, 1, NULL, NULL, 0));
  EXPECT_ERROR(kolo_broadcast(x, 3, KOLO_FLOAT32, 1, comm), KOLO_ERR_INVALID_ARGUMENT, "root 1");
  OK(kolo_comm_destroy(comm));
}

/* The error modes under kolo-run: each builds a communicator, makes one thing go wrong, and
 * checks what every rank got.
 *
 * Every rank runs three steps: a barrier (step 0), the call that goes wrong (step 1), another
 * barrier (step 2). An error reaches a rank at the latest in the step after the fault: a rank
 * still finishing the barrier when a peer's abort arrives gets it there, and a rank whose part
 * of the failing exchange had already arrived complete (a late rank whose peer timed out after
 * sending) returns normally and gets it at its next call — kolo's rule, docs/api.md. So each
 * rank checks: the first failing step returns `code` with a message containing `needle`, no
 * later step succeeds, every later step returns the same code, and the first failure is not
 * after step `latest`. */
typedef struct {
  kolo_result_t code; /* of the first failing step; KOLO_SUCCESS while none has failed */
  int step;
  char message[1024];
} fault_log;

static void step_result(fault_log* log, int step, kolo_result_t r) {
  if (log->code == KOLO_SUCCESS && r != KOLO_SUCCESS) {
    log->code = r;
    log->step = step;
    snprintf(log->message, sizeof log->message, "%s", kolo_get_last_error());
    printf("rank %d: step %d -> %s: %s\n", my_rank, step, kolo_get_error_string(r), log->message);
  } else if (log->code != KOLO_SUCCESS && r != log->code) {
    fprintf(stderr,
            "KOLO_C_FAIL rank=%d mode=%s: step %d returned %d (%s) after step %d failed "
            "with %d; an aborted communicator must keep returning its error\n",
            my_rank, mode, step, (int)r, kolo_get_error_string(r), log->step, (int)log->code);
    ++failures;
  }
}

static void expect_fault(const fault_log* log, kolo_result_t code, const char* needle, int latest) {
  if (log->code != code || log->step > latest ||
      (needle != NULL && strstr(log->message, needle) == NULL) || log->message[0] == '\0') {
    fprintf(stderr,
            "KOLO_C_FAIL rank=%d mode=%s: expected %s (with '%s') by step %d, got %s at "
            "step %d: '%s'\n",
            my_rank, mode, kolo_get_error_string(code), needle ? needle : "", latest,
            kolo_get_error_string(log->code), log->step, log->message);
    ++failures;
  }
}

/* The grow mode's checks on the enlarged communicator, on members and the joiner alike. */
static void check_grown(kolo_comm_t big, int want_rank, int want_size) {
  int r = -1, n = -1;
  OK(kolo_comm_rank(big, &r));
  OK(kolo_comm_size(big, &n));
  CHECK(r == want_rank && n == want_size);
  my_rank = r;
  int64_t in[2] = {r + 1, -7 * (int64_t)r}, out[2] = {0, 0};
  OK(kolo_allreduce(in, out, 2, KOLO_INT64, KOLO_SUM, big));
  CHECK(out[0] == (int64_t)n * (n + 1) / 2 && out[1] == -7 * (int64_t)n * (n - 1) / 2);
  kolo_comm_t again = NULL;
  EXPECT_ERROR(kolo_comm_grow(big, 1, "c-grow-1", 2.0, &again), KOLO_ERR_CONFIG, "was used");
  CHECK(again == NULL);
  OK(kolo_barrier(big));
}

/* Starts this program in mode "join" with the environment less the per-rank variables. */
static pid_t start_joiner(const char* self) {
  static const char* per_rank[] = {"KOLO_RANK=",       "KOLO_SIZE=",       "KOLO_LOCAL_RANK=",
                                   "KOLO_LOCAL_SIZE=", "KOLO_CROSS_RANK=", "KOLO_CROSS_SIZE="};
  size_t n = 0;
  while (environ[n] != NULL) ++n;
  char** env = calloc(n + 1, sizeof(char*));
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    int skip = 0;
    for (size_t j = 0; j < sizeof(per_rank) / sizeof(per_rank[0]); ++j) {
      if (strncmp(environ[i], per_rank[j], strlen(per_rank[j])) == 0) skip = 1;
    }
    if (!skip) env[k++] = environ[i];
  }
  char* argv[] = {(char*)self, (char*)"join", NULL};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, self, NULL, NULL, argv, env);
  free(env);
  CHECK(rc == 0);
  return rc == 0 ? pid : -1;
}

static void check_fault(kolo_comm_t comm, int rank, int size) {
  int32_t a[5] = {1, 2, 3, 4, 5}, b[5];
  fault_log log;
  memset(&log, 0, sizeof log);
  CHECK(size >= 2);
  if (strcmp(mode, "engine-mismatch") == 0) {
    /* The engine's own communicator fails; the one it was created from is untouched. */
    kolo_engine_t engine = NULL;
    OK(kolo_engine_create(&engine, comm));
    kolo_request_t req = NULL;
    OK(kolo_engine_allreduce(engine, "w", a, a, rank == 0 ? 4 : 5, KOLO_INT32, KOLO_SUM, &req));
    EXPECT_ERROR(kolo_request_wait(req), KOLO_ERR_MISMATCH, "'w'");
    int done = 0;
    EXPECT_ERROR(kolo_request_test(req, &done), KOLO_ERR_MISMATCH, "'w'");
    CHECK(done == 1);
    kolo_request_free(req);
    OK(kolo_engine_destroy(engine));
    OK(kolo_barrier(comm));
    return;
  }

  step_result(&log, 0, kolo_barrier(comm));
  if (strcmp(mode, "bad-dtype") == 0) {
    /* Rank 0's own check fails at once; the others' valid call fails too, naming rank 0. */
    step_result(&log, 1,
                kolo_allreduce(a, b, 5, rank == 0 ? (kolo_dtype_t)99 : KOLO_INT32, KOLO_SUM, comm));
    step_result(&log, 2, kolo_barrier(comm));
    expect_fault(&log, KOLO_ERR_INVALID_ARGUMENT,
                 rank == 0 ? "dtype 99 is not a kolo_dtype_t" : "on rank 0", rank == 0 ? 1 : 2);
  } else if (strcmp(mode, "overflow") == 0) {
    /* size x count wraps in the C ABI (2^63 x 2 = 0 elements of output) and 2^63 one-byte
     * elements are beyond any buffer: refused on every rank, nothing read or written. */
    const size_t wraps = SIZE_MAX / (size_t)size + 1;
    step_result(&log, 1, kolo_allgather(a, b, wraps, KOLO_UINT8, comm));
    step_result(&log, 2, kolo_barrier(comm));
    expect_fault(&log, KOLO_ERR_INVALID_ARGUMENT, "elements of 1 bytes overflow", 1);
  } else if (strcmp(mode, "mismatch") == 0) {
    step_result(&log, 1, kolo_allreduce(a, b, rank == 0 ? 4 : 5, KOLO_INT32, KOLO_SUM, comm));
    step_result(&log, 2, kolo_barrier(comm));
    expect_fault(&log, KOLO_ERR_MISMATCH, "allreduce", 2);
  } else if (strcmp(mode, "dead-peer") == 0 || strcmp(mode, "abort") == 0) {
    const int aborting = strcmp(mode, "abort") == 0;
    if (rank == size - 1) {
      if (log.code != KOLO_SUCCESS) ++failures;
      if (aborting) OK(kolo_comm_abort(comm));
      printf("KOLO_C_PASS rank=%d mode=%s (%s)\n", rank, mode, aborting ? "aborted" : "exiting");
      fflush(stdout);
      _exit(failures ? 1 : 0); /* gone without destroying anything */
    }
    step_result(&log, 1, kolo_allreduce(a, b, 5, KOLO_INT32, KOLO_SUM, comm));
    step_result(&log, 2, kolo_barrier(comm));
    expect_fault(&log, KOLO_ERR_PEER_LOST, aborting ? "kolo_comm_abort" : NULL, 1);
  } else if (strcmp(mode, "shrink") == 0) {
    if (rank == size - 1) {
      printf("KOLO_C_PASS rank=%d mode=%s (exiting)\n", rank, mode);
      fflush(stdout);
      _exit(log.code != KOLO_SUCCESS ? 1 : 0);
    }
    step_result(&log, 1, kolo_allreduce(a, b, 5, KOLO_INT32, KOLO_SUM, comm));
    step_result(&log, 2, kolo_barrier(comm));
    expect_fault(&log, KOLO_ERR_PEER_LOST, NULL, 2);
    kolo_comm_t small = NULL;
    const int bad = rank;
    EXPECT_ERROR(kolo_comm_shrink(comm, &bad, 1, -1, &small), KOLO_ERR_INVALID_ARGUMENT,
                 "passed itself");
    CHECK(small == NULL);
    OK(kolo_comm_shrink(comm, NULL, 0, -1, &small));
    int r = -1, n = -1;
    OK(kolo_comm_rank(small, &r));
    OK(kolo_comm_size(small, &n));
    CHECK(r == rank && n == size - 1);
    int32_t in[3] = {rank + 1, 10 * (rank + 1), -rank}, out[3] = {0, 0, 0};
    const int32_t sum = (int32_t)(n * (n + 1) / 2);
    OK(kolo_allreduce(in, out, 3, KOLO_INT32, KOLO_SUM, small));
    CHECK(out[0] == sum && out[1] == 10 * sum && out[2] == -(int32_t)(n * (n - 1) / 2));
    /* A revocation fails whatever call a peer is in (it carries no call number): the others'
     * allreduce may complete or return KOLO_ERR_REVOKED; the barrier after it fails. */
    out[0] = out[1] = out[2] = 0;
    const kolo_result_t second = kolo_allreduce(in, out, 3, KOLO_INT32, KOLO_SUM, small);
    if (rank == 0) {
      CHECK(second == KOLO_SUCCESS);
      OK(kolo_comm_revoke(small, "the test revokes"));
    } else if (second == KOLO_SUCCESS) {
      CHECK(out[0] == sum && out[1] == 10 * sum);
    } else {
      CHECK(second == KOLO_ERR_REVOKED && strstr(kolo_get_last_error(), "the test revokes"));
    }
    EXPECT_ERROR(kolo_barrier(small), KOLO_ERR_REVOKED, "the test revokes");
    OK(kolo_comm_destroy(small));
    /* The old communicator stays failed. */
    EXPECT_ERROR(kolo_barrier(comm), KOLO_ERR_PEER_LOST, NULL);
    return;
  } else if (strcmp(mode, "grow") == 0) {
    const pid_t joiner = rank == 0 ? start_joiner("/proc/self/exe") : -1;
    kolo_comm_t big = NULL;
    EXPECT_ERROR(kolo_comm_grow(comm, 0, "c-grow-1", -1, &big), KOLO_ERR_INVALID_ARGUMENT,
                 "count 0");
    EXPECT_ERROR(kolo_comm_grow(comm, 1, NULL, -1, &big), KOLO_ERR_INVALID_ARGUMENT, "token");
    CHECK(big == NULL);
    OK(kolo_comm_grow(comm, 1, "c-grow-1", -1, &big));
    if (big != NULL) {
      check_grown(big, rank, size + 1);
      OK(kolo_comm_destroy(big));
    }
    my_rank = rank;
    if (joiner > 0) {
      int st = 0;
      while (waitpid(joiner, &st, 0) < 0 && errno == EINTR) {
      }
      CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    return;
  } else if (strcmp(mode, "timeout") == 0) {
    const char* t = getenv("KOLO_TIMEOUT_SECONDS");
    CHECK(t != NULL);
    const double timeout = t ? atof(t) : 30.0;
    if (rank == 1) sleep_ms((long)(timeout * 1000.0) + 1500); /* late beyond the deadline */
    const double t0 = now_seconds();
    step_result(&log, 1, kolo_allreduce(a, b, 5, KOLO_INT32, KOLO_SUM, comm));
    if (rank == 0) CHECK(now_seconds() - t0 >= timeout * 0.9);
    step_result(&log, 2, kolo_barrier(comm));
    expect_fault(&log, KOLO_ERR_TIMEOUT, "timed out", rank == 0 ? 1 : 2);
  } else {
    fprintf(stderr, "unknown mode %s\n", mode);
    ++failures;
  }
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  mode = argc > 1 ? argv[1] : "collectives";
  const char* env_rank = getenv("KOLO_RANK");
  my_rank = env_rank ? atoi(env_rank) : 0;

  if (strcmp(mode, "local") == 0) {
    check_local_errors();
  } else if (strcmp(mode, "join") == 0) {
    /* Started by rank 0 of a "grow" run: two members, this process rank 2 of 3. */
    kolo_comm_t big = NULL;
    OK(kolo_comm_join("c-grow-1", -1, &big));
    if (big != NULL) {
      check_grown(big, 2, 3);
      OK(kolo_comm_destroy(big));
    }
  } else {
    kolo_comm_t comm = NULL;
    if (strcmp(mode, "explicit") == 0) {
      /* What a binding does when its framework hands it rank, size and a store address. */
      const char* size = getenv("KOLO_SIZE");
      const char* store = getenv("KOLO_STORE");
      OK(kolo_comm_init(&comm, my_rank, size ? atoi(size) : 1, store, getenv("KOLO_SECRET"), 0));
    } else {
      OK(kolo_comm_init_env(&comm));
    }
    if (comm == NULL) {
      fprintf(stderr, "KOLO_C_FAIL rank=%d: no communicator\n", my_rank);
      return 1;
    }
    int size = 0;
    OK(kolo_comm_size(comm, &size));
    if (strcmp(mode, "collectives") == 0 || strcmp(mode, "explicit") == 0) {
      run_collectives(comm);
    } else {
      check_fault(comm, my_rank, size);
    }
    OK(kolo_comm_destroy(comm));
  }
  if (failures != 0) {
    fprintf(stderr, "KOLO_C_FAIL rank=%d mode=%s: %d failed checks\n", my_rank, mode, failures);
    return 1;
  }
  printf("KOLO_C_PASS rank=%d mode=%s\n", my_rank, mode);
  return 0;
}
