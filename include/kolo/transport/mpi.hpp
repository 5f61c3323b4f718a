// kolo/transport/mpi.hpp — kolo over MPI, for jobs started by mpirun and for kolo inside an
// existing MPI application. The only kolo header that includes <mpi.h>.
//
//   MpiTransport        kolo's own algorithms (ring, trees, recursive doubling, …) over
//                       MPI_Isend / MPI_Irecv / MPI_Test on a duplicate of the caller's
//                       communicator: the Transport concept, signatures, deadlines, abort.
//   MpiNativeTransport  the same, plus native_<collective>(): Communicator hands allreduce,
//                       allgather, broadcast, reduce_scatter, alltoall and barrier to MPI's own
//                       collectives (MPI_Iallreduce and friends, with deadlines, on kolo-owned
//                       copies; MpiOptions::native_blocking: MPI_Allreduce & co. in place, no
//                       deadline). float16/bfloat16 travel as a 2-byte contiguous MPI type reduced
//                       by user operations that compute in fp32 (kolo's kernels); average is MPI's
//                       sum followed by kolo::finish_average. Signatures are compared first.
//
//   auto comm = kolo::Communicator<kolo::MpiTransport>(
//       std::make_unique<kolo::MpiTransport>(MPI_COMM_WORLD));   // or any intracommunicator
//
// Construction is collective over the given communicator (like MPI_Comm_dup, which it calls):
// everything kolo sends goes over the duplicate, so the application's own traffic, tags and
// collectives on the original never meet kolo's. Topology comes from MPI: local ranks from
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), cross ranks from a split by local rank (as Horovod
// does: cross_size is the number of hosts as seen by local rank 0). No KOLO_* variable is needed;
// KOLO_TIMEOUT_SECONDS, KOLO_SPIN_US and the KOLO_MPI_* knobs of MpiOptions are read if set.
//
// MPI's lifetime. If MPI is not initialised when the first transport is built, kolo calls
// MPI_Init_thread asking for MPI_THREAD_MULTIPLE and accepts what the library provides (Open MPI
// and MPICH give MULTIPLE; kolo itself only needs the calls of one communicator to come from one
// thread at a time, i.e. SERIALIZED, as for every kolo transport), and then finalizes at process
// exit — only then, and only after a successful exit (see below). If the application initialised
// MPI, it stays the owner: kolo never finalizes it. Either way kolo hangs a delete callback on
// MPI_COMM_SELF, which MPI_Finalize runs first, so live transports are closed cleanly before
// MPI goes away.
//
// Wire protocol. Every message is a 48-byte header (magic, payload size, the sender's Signature)
// followed by the payload: in the same MPI message when the payload is small (<= inline_bytes, so
// header and data make one eager message), else as a second message on a data tag. Receives
// always post room for a whole inline message, so a sender that disagrees about the size is still
// received and named: a mismatch becomes a MismatchError naming both calls, exactly as with
// kolo's own transports. Payloads travel between kolo-owned buffers (copied in on send, copied or
// folded with kolo's reduce kernels into the destination on receive), never straight from or into
// the caller's memory: after an abort the caller frees its buffers while MPI may still be moving
// a matched message (docs/mpi.md tells how zero-copy wedged Open MPI). Buffers of requests still
// pending when a transport closes are kept alive rather than freed under MPI's feet.
//
// Errors. Every wait polls MPI_Test with core/wait.hpp's backoff (spin KOLO_SPIN_US, then yields,
// sleeps growing to 1 ms — never a hot spin when ranks outnumber cores) and throws TimeoutError
// past its deadline. abort(err) does NOT call MPI_Abort: it sends the error (kind, origin,
// reason) to every rank of the communicator on a control tag and keeps the process alive; every
// rank throws the same exception class ("[reported by rank R]") at its next wait, and the
// application decides whether to exit. A transport that is destroyed, or whose process exits,
// tells its peers how many messages and collectives it completed with each of them: a peer still
// waiting for it then gets a PeerLostError at once instead of a timeout. A rank killed by a
// signal is the launcher's business: mpirun ends the whole job. A closed transport's duplicate
// communicator is not freed before MPI_Finalize (see close(): Open MPI reuses freed context ids
// and a late notice would land in the next communicator), so each transport built costs one
// communicator handle for the life of MPI.
//
// Exit. On a failing exit (status != 0) kolo does not call MPI_Finalize: under Open MPI it waits
// in a fence for every other rank, and those may be waiting for this one. mpirun sees the
// non-zero status and terminates the job instead. (glibc's on_exit gives the status; elsewhere
// kolo finalizes on every exit.)
//
// The parts, one job each (transport/mpi/):
//   runtime.hpp    MPI's process-wide state kolo owns, MpiOptions, the backoff
//   wire.hpp       the message header, control message and kolo-owned buffers
//   transport.hpp  MpiTransport: construction, topology, the posting/completion API
//   progress.hpp   how it posts, progresses and delivers messages
//   control.hpp    its control channel: abort, goodbye, departed peers
//   native.hpp     MpiNativeTransport: MPI's own collectives
#pragma once

#include "kolo/transport/mpi/native.hpp"
