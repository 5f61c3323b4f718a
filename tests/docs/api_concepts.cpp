// Compile-time checks of the range entry points, run by tests/docs/compile_fail.cmake:
//  1. compiled as is, this file must compile: the Communicator and the Engine accept vectors,
//     arrays, spans and a user type modelling std::ranges::contiguous_range;
//  2. compiled with -DKOLO_BAD, it must fail with exactly one error on each line that ends in an
//     "expect" comment, whose diagnostic names the concept given there (what is wrong, in a few
//     dozen lines rather than pages of template instantiations), and no error anywhere else.
#include <array>
#include <list>
#include <span>
#include <string>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

// A user type modelling std::ranges::contiguous_range (begin/end over contiguous memory).
struct Grad {
  float v[8] = {};
  float* begin() { return v; }
  float* end() { return v + 8; }
};

void accepted(kolo::Communicator<>& comm, kolo::Engine<>& engine) {
  std::vector<float> v(4);
  std::array<std::int32_t, 3> a{};
  std::span<double> s;
  Grad g;
  const std::vector<std::int64_t> c(2);
  comm.allreduce(v, kolo::ReduceOp::sum);
  comm.broadcast(a, 0);
  comm.allreduce(g);
  comm.reduce(s, kolo::ReduceOp::max, 0);
  engine.allreduce_async("v", v, kolo::ReduceOp::average);
  engine.allreduce_async("g", g);
  engine.broadcast_async("a", a, 0);
  engine.allreduce_async("s", s);
  engine.allgather_async("c", c);
}

#ifdef KOLO_BAD
void refused(kolo::Communicator<>& comm, kolo::Engine<>& engine) {
  std::list<float> l(4);
  std::vector<std::string> w(4);
  std::vector<bool> b(4);
  const std::vector<float> cv(4);
  std::list<std::int32_t> li(4);
  comm.allreduce(l, kolo::ReduceOp::sum);  // expect ContiguousBuffer (a list: not contiguous)
  comm.broadcast(w, 0);                    // expect ContiguousBuffer (not a kolo element type)
  comm.allreduce(b);                       // expect ContiguousBuffer (vector<bool> packs bits)
  engine.allreduce_async("l", l);          // expect AsyncInOutBuffer (not contiguous)
  engine.allreduce_async("t", std::vector<float>(4));  // expect AsyncInOutBuffer (would dangle)
  engine.broadcast_async("c", cv, 0);                  // expect AsyncInOutBuffer (written in place)
  engine.allgather_async("li", li);                    // expect AsyncBuffer (not contiguous)
}
#endif
