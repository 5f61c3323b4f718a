/* The C ABI from another project's C code: a single-rank communicator (no launcher needed), a
 * blocking allreduce and an engine allreduce, the version, and an error with its message.
 * Exits 0 only if every number it produced is right. Built against kolo::kolo_c (shared),
 * kolo::kolo_c_static, and, for an installed prefix, `pkg-config kolo_c` without CMake. */
#include <kolo/c/kolo.h>

#include <stdio.h>
#include <string.h>

#ifndef KOLO_CONSUMER_MODE
#define KOLO_CONSUMER_MODE "unknown"
#endif
#ifndef KOLO_CONSUMER_LINK
#define KOLO_CONSUMER_LINK "kolo_c"
#endif

static int failures = 0;

static void expect(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "kolo C consumer: FAILED: %s (last error: %s)\n", what, kolo_get_last_error());
    ++failures;
  }
}

int main(void) {
  expect(kolo_get_version() == KOLO_VERSION_CODE, "library version equals the header's");
  expect(kolo_get_abi_version() == KOLO_C_ABI_VERSION, "ABI version equals the header's");

  kolo_comm_t comm = NULL;
  expect(kolo_comm_init(&comm, 0, 1, NULL, NULL, 0) == KOLO_SUCCESS, "kolo_comm_init");
  if (comm == NULL) return 1;
  int rank = -1, size = -1;
  expect(kolo_comm_rank(comm, &rank) == KOLO_SUCCESS && rank == 0, "rank 0");
  expect(kolo_comm_size(comm, &size) == KOLO_SUCCESS && size == 1, "size 1");

  double in[3] = {1.5, -2.0, 4.25}, out[3] = {0, 0, 0};
  expect(kolo_allreduce(in, out, 3, KOLO_FLOAT64, KOLO_SUM, comm) == KOLO_SUCCESS, "allreduce");
  expect(out[0] == 1.5 && out[1] == -2.0 && out[2] == 4.25, "allreduce values");

  kolo_engine_t engine = NULL;
  kolo_request_t req = NULL;
  int ids[4] = {7, 8, 9, 10};
  expect(kolo_engine_create(&engine, comm) == KOLO_SUCCESS, "kolo_engine_create");
  expect(
      kolo_engine_allreduce(engine, "ids", ids, ids, 4, KOLO_INT32, KOLO_MAX, &req) == KOLO_SUCCESS,
      "engine allreduce");
  expect(kolo_request_wait(req) == KOLO_SUCCESS, "wait");
  expect(ids[0] == 7 && ids[3] == 10, "engine allreduce values");
  kolo_request_free(req);
  expect(kolo_engine_destroy(engine) == KOLO_SUCCESS, "kolo_engine_destroy");

  expect(kolo_broadcast(in, 3, KOLO_FLOAT64, 3, comm) == KOLO_ERR_INVALID_ARGUMENT,
         "broadcast from root 3 of 1 is an invalid argument");
  expect(strstr(kolo_get_last_error(), "root 3") != NULL, "the message names the root");
  expect(kolo_comm_destroy(comm) == KOLO_SUCCESS, "kolo_comm_destroy");

  if (failures != 0) return 1;
  printf("kolo C consumer (%s, %s): ok\n", KOLO_CONSUMER_MODE, KOLO_CONSUMER_LINK);
  return 0;
}
