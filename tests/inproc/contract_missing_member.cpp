// Compiled by CTest (inproc/contract/static_assert_names_the_member), never linked: a transport
// that lacks aborted() must be refused with a message that names the member.
#include <kolo/communicator.hpp>

struct NoAbortedTransport {
  struct Request {
    int id = 0;
  };
  int rank() const { return 0; }
  int size() const { return 1; }
  Request isend(int, const void*, std::size_t, const kolo::Signature&) { return {}; }
  Request irecv(int, void*, std::size_t, const kolo::Signature&) { return {}; }
  Request irecv_reduce(int, void*, const void*, std::size_t, const kolo::ReduceSpec&,
                       const kolo::Signature&) {
    return {};
  }
  bool done(Request) const { return true; }
  bool test(Request) { return true; }
  void wait(Request, const kolo::Deadline&) {}
  void wait_any_progress(const kolo::Deadline&) {}
  void abort(const kolo::Error&) {}
  [[noreturn]] void rethrow() const { throw kolo::Error("x"); }
  double timeout_seconds() const { return 1; }
  // bool aborted() const is missing
};

int main() {
  kolo::Communicator<NoAbortedTransport> c(std::make_unique<NoAbortedTransport>());
  return c.size();
}
