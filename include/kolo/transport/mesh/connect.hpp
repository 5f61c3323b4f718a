// kolo/transport/mesh/connect.hpp — the mesh's set-up: how each peer is reached, and the
// connections themselves (shared-memory segments and doorbells, authenticated TCP sockets).
//
// Routes: a peer with this rank's host key is reached through shared memory, any other through
// TCP; the route policy (RouteMode) can force TCP for every peer, or refuse a peer on another
// host (ShmTransport). Everything after that is a fixed sequence that every rank walks in step,
// with the job's store as the meeting point:
//   1. allgather "pid|address" (the address only when this rank needs TCP at all);
//   2. create this rank's segment and doorbell; barrier "shm-created";
//   3. map every local peer's segment, open its doorbell and its pidfd;
//   4. TCP: higher ranks connect to lower ones while an acceptor thread serves the handshakes of
//      the higher ones — all pending handshakes at once in one poll loop, each with a 10 s
//      budget, so a silent or garbage-sending stranger stalls nobody. Every connection starts
//      with the mutual HMAC-SHA256 challenge-response of net/auth.hpp, the client's rank and
//      purpose bound into the MAC. The listening socket is closed at the end: later strangers are
//      refused by the kernel;
//   5. barrier "mesh-ready"; then the segment's and doorbell's names are unlinked (every rank has
//      opened them), so a crash leaks nothing.
// Barriers are entered by every rank, with or without local peers, or they would not meet. The
// store keys and barrier names are part of the protocol (tests that play a rank by hand write
// them too).
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kolo/core/deadline.hpp"
#include "kolo/core/error.hpp"
#include "kolo/net/auth.hpp"
#include "kolo/net/socket.hpp"
#include "kolo/topology/bootstrap.hpp"
#include "kolo/transport/mesh/shm_channel.hpp"
#include "kolo/transport/mesh/tcp_channel.hpp"
#include "kolo/transport/route.hpp"
#include "kolo/transport/transport_config.hpp"

namespace kolo {

namespace detail {

// One peer's connection, as set-up leaves it.
struct PeerLink {
  Route route = Route::self;
  int pid = 0;
  ShmChannel shm;  // route shm
  TcpChannel tcp;  // route tcp
};

// Everything set-up made.
struct MeshLinks {
  std::vector<PeerLink> peers;  // by rank (this rank's entry: Route::self)
  ShmSegment own;               // valid when some peer is reached through shared memory
  std::size_t local_ranks = 0;  // ranks sharing memory, this one included (0: none)
};

// The route to every rank under `mode` (a peer on another host under shm_only: ConfigError).
inline std::vector<Route> choose_routes(const Bootstrap& boot, RouteMode mode) {
  const int rank = boot.rank();
  std::vector<Route> routes(static_cast<std::size_t>(boot.size()), Route::self);
  for (int p = 0; p < boot.size(); ++p) {
    Route& r = routes[static_cast<std::size_t>(p)];
    if (p == rank) {
      r = Route::self;
    } else if (mode == RouteMode::tcp_only) {
      r = Route::tcp;
    } else if (boot.same_host(p)) {
      r = Route::shm;
    } else if (mode == RouteMode::routed) {
      r = Route::tcp;
    } else {
      throw ConfigError("ShmTransport needs every rank on one host, but rank " + std::to_string(p) +
                        " is on host '" + boot.host_keys()[static_cast<std::size_t>(p)] +
                        "' and rank " + std::to_string(rank) + " on '" + boot.topology().host_key +
                        "': use RoutedTransport (KOLO_TRANSPORT=routed) or TcpTransport");
    }
  }
  return routes;
}

// Builds every connection of this rank (see the file comment for the sequence).
class MeshConnector {
 public:
  MeshConnector(Bootstrap& boot, ShmGeometry geometry, std::size_t frame_bytes)
      : boot_(boot),
        rank_(boot.rank()),
        size_(boot.size()),
        timeout_(boot.topology().timeout_seconds),
        geometry_(geometry),
        frame_bytes_(frame_bytes) {}

  MeshLinks connect(const std::vector<Route>& routes) {
    routes_ = routes;
    MeshLinks links;
    links.peers.resize(static_cast<std::size_t>(size_));
    bool need_tcp = false, need_shm = false;
    for (int p = 0; p < size_; ++p) {
      const Route r = routes[static_cast<std::size_t>(p)];
      links.peers[static_cast<std::size_t>(p)].route = r;
      need_tcp |= r == Route::tcp;
      need_shm |= r == Route::shm;
    }
    if (size_ == 1) return links;
    const Topology& topo = boot_.topology();
    const Deadline dl = Deadline::after(timeout_);

    net::Socket listener;
    std::string my_addr = "-";
    if (need_tcp) {
      if (topo.listen_fd >= 0) {
        listener = net::Socket(topo.listen_fd);
      } else {
        listener = net::listen_tcp("0.0.0.0", 0);
      }
      my_addr = boot_.advertised_ip() + ":" + std::to_string(net::local_port(listener.fd()));
    }
    const std::string token = boot_.job_token();
    // This rank's geometry, for its local peers to compare (check_geometry); set before the
    // allgather, so that it is there once every rank's "mesh" entry is.
    if (need_shm) {
      boot_.store()->set(
          boot_.prefix() + "shm-geometry/" + std::to_string(rank_),
          std::to_string(geometry_.slots) + " " + std::to_string(geometry_.slot_bytes));
    }
    const auto infos = boot_.allgather("mesh", std::to_string(::getpid()) + "|" + my_addr);
    for (int p = 0; p < size_; ++p) {
      const std::string& info = infos[static_cast<std::size_t>(p)];
      const auto bar = info.find('|');
      links.peers[static_cast<std::size_t>(p)].pid = std::stoi(info.substr(0, bar));
    }

    // Barriers are entered by every rank, with or without local peers, or they would not meet.
    std::vector<std::size_t> local_index;
    // From the first name this rank creates until the names are removed below, a failure of
    // set-up (a peer that never connects, a bad address, a stranger) removes them here: the
    // peers that mapped them keep their mappings, and nothing is left in /dev/shm.
    // A rank whose shared memory fails (the local ranks' geometries differ, /dev/shm is too
    // small, a peer's segment has another size) still enters the next barrier, having posted
    // its error, and every rank that passes the barrier raises it too: an error on every rank
    // at once, not a timeout on the others.
    std::exception_ptr failed;
    const auto note_failure = [&](const Error& e) {
      failed = std::current_exception();
      const char kind = e.kind() == ErrorKind::config ? 'C' : 'E';
      boot_.store()->set(boot_.prefix() + "shm-failed",
                         std::string(1, kind) + "rank " + std::to_string(rank_) + ": " + e.what());
    };
    const auto raise_failure = [&] {
      if (failed) std::rethrow_exception(failed);
      if (auto f = boot_.store()->try_get(boot_.prefix() + "shm-failed"); f && !f->empty()) {
        const std::string why = "shared-memory set-up failed on " + f->substr(1);
        if ((*f)[0] == 'C') throw ConfigError(why);
        throw Error(why);
      }
    };
    try {
      if (need_shm) {
        try {
          check_geometry();
          local_index = create_shm(token, links);
        } catch (const Error& e) {
          note_failure(e);
        }
      }
      boot_.barrier("shm-created");
      raise_failure();
      if (need_shm) {
        try {
          map_peers_shm(token, links, local_index);
        } catch (const Error& e) {
          note_failure(e);
        }
      }
      if (need_tcp) connect_tcp(std::move(listener), infos, links, dl);
      boot_.barrier("mesh-ready");
      raise_failure();
    } catch (...) {
      if (need_shm) ShmSegment::unlink_names(token, rank_);
      throw;
    }
    // Everyone has mapped everything: remove the names so a crash cannot leak them.
    if (need_shm) ShmSegment::unlink_names(token, rank_);
    return links;
  }

 private:
  static constexpr std::size_t kNotLocal = ~std::size_t{0};

  // Every local rank (this one and its shared-memory peers) must have the same geometry: their
  // rings lie in each other's segments. The first difference, in rank order, is a ConfigError
  // naming the variable and both values; every local rank finds the same one. A peer that
  // published no geometry (a rank played by hand in a test) is not compared.
  void check_geometry() {
    struct Seen {
      int rank;
      std::size_t slots, slot_bytes;
    };
    std::optional<Seen> first;
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ && routes_[static_cast<std::size_t>(p)] != Route::shm) continue;
      Seen s{p, geometry_.slots, geometry_.slot_bytes};
      if (p != rank_) {
        const auto v = boot_.store()->try_get(boot_.prefix() + "shm-geometry/" + std::to_string(p));
        unsigned long long k = 0, b = 0;
        if (!v || std::sscanf(v->c_str(), "%llu %llu", &k, &b) != 2) continue;
        s.slots = static_cast<std::size_t>(k);
        s.slot_bytes = static_cast<std::size_t>(b);
      }
      if (!first) {
        first = s;
        continue;
      }
      const auto differ = [&](std::string_view name, std::size_t a, std::size_t b) {
        if (a == b) return;
        const std::string var(name);
        throw ConfigError(
            "the ranks of this host disagree on their shared-memory geometry: " + var + "=" +
            std::to_string(a) + " on rank " + std::to_string(first->rank) + " but " + var + "=" +
            std::to_string(b) + " on rank " + std::to_string(p) +
            " (every rank of a host needs the same KOLO_SHM_SLOTS and "
            "KOLO_SHM_SLOT_BYTES)");
      };
      differ(config::vars::shm_slots.name, first->slots, s.slots);
      differ(config::vars::shm_slot_bytes.name, first->slot_bytes, s.slot_bytes);
    }
  }

  // The local ranks (this one included) get indices 0.. in rank order: their rings' positions.
  std::vector<std::size_t> create_shm(const std::string& token, MeshLinks& links) {
    std::vector<std::size_t> local_index(static_cast<std::size_t>(size_), kNotLocal);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || links.peers[static_cast<std::size_t>(p)].route == Route::shm) {
        local_index[static_cast<std::size_t>(p)] = links.local_ranks++;
      }
    }
    geometry_ = fit_shm_geometry(geometry_, links.local_ranks);
    links.own.create(token, rank_, links.local_ranks, geometry_,
                     local_index[static_cast<std::size_t>(rank_)]);
    return local_index;
  }

  void map_peers_shm(const std::string& token, MeshLinks& links,
                     const std::vector<std::size_t>& local_index) {
    const std::size_t me = local_index[static_cast<std::size_t>(rank_)];
    for (int p = 0; p < size_; ++p) {
      PeerLink& peer = links.peers[static_cast<std::size_t>(p)];
      if (peer.route != Route::shm) continue;
      peer.shm.open(token, p, peer.pid, links.local_ranks, me,
                    local_index[static_cast<std::size_t>(p)], links.own, geometry_);
    }
  }

  void connect_tcp(net::Socket listener, const std::vector<std::string>& infos, MeshLinks& links,
                   const Deadline& dl) {
    // The secret bound to this communicator's job token (h4: net::job_key): a rank of another
    // job or communicator that shares KOLO_SECRET fails the handshake.
    const std::string secret = net::job_key(boot_.topology().secret, boot_.job_token());
    // Higher ranks connect to lower ones; an acceptor thread serves the handshakes of the
    // higher ranks meanwhile, all of them at once, so a silent stranger stalls nobody.
    std::vector<int> expect;
    for (int p = rank_ + 1; p < size_; ++p) {
      if (links.peers[static_cast<std::size_t>(p)].route == Route::tcp) expect.push_back(p);
    }
    std::vector<int> fds(static_cast<std::size_t>(size_), -1);
    std::exception_ptr accept_error;
    std::thread acceptor([&] {
      try {
        accept_peers(listener.fd(), secret, expect, fds, dl);
      } catch (...) {
        accept_error = std::current_exception();
      }
    });
    std::exception_ptr connect_error;
    try {
      for (int p = 0; p < rank_; ++p) {
        if (links.peers[static_cast<std::size_t>(p)].route != Route::tcp) continue;
        const std::string& info = infos[static_cast<std::size_t>(p)];
        const auto hp = net::parse_host_port(info.substr(info.find('|') + 1),
                                             "address of rank " + std::to_string(p));
        const std::string who = "rank " + std::to_string(p) + " (" + hp.str() + ")";
        // h4: retries while the peer's listener is at its handshake cap (a flood).
        net::Socket s = net::connect_authenticated(
            hp.host, hp.port, secret, net::Hello{net::kPurposeData, rank_, 0}, dl, who);
        fds[static_cast<std::size_t>(p)] = s.release();
      }
    } catch (...) {
      connect_error = std::current_exception();
      stop_accepting_.store(true);
    }
    acceptor.join();
    if (connect_error || accept_error) {
      for (int fd : fds) {
        if (fd >= 0) ::close(fd);
      }
      std::rethrow_exception(connect_error ? connect_error : accept_error);
    }
    for (int p = 0; p < size_; ++p) {
      PeerLink& peer = links.peers[static_cast<std::size_t>(p)];
      if (peer.route == Route::tcp) {
        peer.tcp.open(fds[static_cast<std::size_t>(p)], p, rank_, frame_bytes_);
      }
    }
    // The listener closes with `listener` here: later strangers are refused by the kernel.
  }

  void accept_peers(int lfd, const std::string& secret, const std::vector<int>& expect,
                    std::vector<int>& out, const Deadline& dl) {
    std::size_t missing = expect.size();
    struct Pending {
      net::Socket sock;
      std::unique_ptr<net::ServerHandshake> hs;
      Deadline until;
      net::AcceptGate::Clock::time_point since = net::AcceptGate::Clock::now();  // h4
    };
    std::vector<Pending> pending;
    net::AcceptGate gate;  // h4: at most net::kMaxPendingHandshakes strangers at once
    net::set_nonblocking(lfd, true);
    while (missing > 0) {
      if (stop_accepting_.load()) return;
      if (dl.expired()) {
        std::string who;
        for (int p : expect) {
          if (out[static_cast<std::size_t>(p)] < 0)
            who += (who.empty() ? "" : ", ") + std::to_string(p);
        }
        throw TimeoutError("rank " + std::to_string(rank_) +
                           " timed out waiting for TCP connections from rank(s) " + who +
                           " (KOLO_TIMEOUT_SECONDS=" + std::to_string(timeout_) + ")");
      }
      std::vector<pollfd> fds;
      fds.push_back({lfd, gate.events(), 0});  // h4: 0 while paused (out of descriptors)
      for (auto& pc : pending) fds.push_back({pc.sock.fd(), POLLIN, 0});
      const int rc = ::poll(fds.data(), fds.size(), dl.remaining_ms(100));
      if (rc < 0 && errno != EINTR) throw Error("poll failed: " + net::errno_text(errno));
      if (fds[0].revents & POLLIN) {
        int fd = gate.accept(lfd);
        if (fd >= 0) {
          // h4: at the cap the oldest handshake makes room (marked here, dropped below, not
          // polled this turn), or the newcomer is closed before its challenge (it retries).
          const auto admit =
              gate.admit(pending.size(),
                         pending.empty() ? net::AcceptGate::Clock::now() : pending.front().since);
          if (admit == net::AcceptGate::Admit::evict_oldest) {
            pending.front().until = Deadline::after(0);
            fds[1].revents = 0;
          }
          if (admit == net::AcceptGate::Admit::refuse) {
            ::close(fd);
            fd = -1;
          }
        } else if (!pending.empty() && gate.reclaim(pending.size(), pending.front().since)) {
          pending.front().until = Deadline::after(0);  // h4: out of descriptors: free the
          fds[1].revents = 0;                          // oldest handshake's
        }
        if (fd >= 0) {
          Pending pc{net::Socket(fd), nullptr, Deadline::after(10.0).earlier(dl)};
          try {
            pc.hs = std::make_unique<net::ServerHandshake>(fd, secret);
            pending.push_back(std::move(pc));
          } catch (const Error&) {  // could not even send the challenge: drop it
          }
        }
      }
      for (std::size_t i = 0; i < pending.size();) {
        bool drop = false;
        const short rev = i + 1 < fds.size() ? fds[i + 1].revents : 0;
        if (rev) {
          try {
            if (pending[i].hs->on_readable()) {
              const net::Hello h = pending[i].hs->hello();
              const bool wanted = h.purpose == net::kPurposeData &&
                                  std::find(expect.begin(), expect.end(), h.rank) != expect.end() &&
                                  out[static_cast<std::size_t>(h.rank)] < 0;
              if (wanted) {
                out[static_cast<std::size_t>(h.rank)] = pending[i].sock.release();
                --missing;
              }
              drop = true;  // accepted (fd moved out) or an authenticated but unexpected client
            }
          } catch (const Error&) {
            drop = true;  // wrong secret, garbage, or closed: refuse silently
          }
        } else if (pending[i].until.expired()) {
          drop = true;  // silent stranger
        }
        if (drop) {
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
    }
  }

  Bootstrap& boot_;
  int rank_;
  int size_;
  double timeout_;
  ShmGeometry geometry_;
  std::vector<Route> routes_;
  std::size_t frame_bytes_;
  std::atomic<bool> stop_accepting_{false};
};

// How every peer of `boot` is reached under `mode`, connected.
inline MeshLinks connect_mesh(Bootstrap& boot, RouteMode mode, ShmGeometry geometry,
                              std::size_t frame_bytes) {
  const std::vector<Route> routes = choose_routes(boot, mode);
  return MeshConnector(boot, geometry, frame_bytes).connect(routes);
}

}  // namespace detail
}  // namespace kolo
