// kolo/topology/store.hpp — the rendezvous key-value store: how ranks find each other.
//
// One process (the launcher, or rank 0) runs a StoreServer; every rank opens a StoreClient and
// uses set/get/add/wait to exchange addresses, host keys and barrier counters. It is the first
// thing a job talks to, so it has to be robust against what is out there on the network: every
// connection proves the job secret (net/auth.hpp) before a single command is read, and a silent
// or malicious peer can never stall the others.
//
// The parts, one job each:
//   store/protocol.hpp  the wire format: framing, request/reply encoding and decoding (pure)
//   store/server.hpp    StoreServer: the poll loop, timers, requests, parked waiters
//   store/server_conn.hpp  its connections: accepting, handshakes, reads, writes, framing
//   store/client.hpp    StoreClient: the KvStore over one connection
// The wire protocol itself is described in store/protocol.hpp.
#pragma once

#include "kolo/topology/store/client.hpp"
#include "kolo/topology/store/protocol.hpp"
#include "kolo/topology/store/server.hpp"
