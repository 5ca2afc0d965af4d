// Package symmetric is libsymm's symmetric memory: each rank of a group
// allocates a block of exportable memory; a rendezvous maps every peer's
// block into every rank's address space, so one device reads and writes its
// peers' buffers directly. It follows PyTorch's
// torch/csrc/distributed/c10d/symm_mem/ (CUDA backend) in layout and
// semantics.
//
// # Blocks
//
// A block is [buffer | signal pad | sync area]: the buffer starts at the
// block (so the pointer PyTorch's MemPool gets is the buffer), the signal pad
// of SignalPadSize bytes starts at the buffer size rounded up to 16 bytes,
// and the sync area of SyncAreaSize bytes (the collectives' epoch meetings,
// libsymm's own) follows it. A block belongs to no group until it is
// rendezvoused; it can be rendezvoused with several groups, each giving its
// own Handle; the first group that every rank finds free of another owner
// meets through the sync area, the others through the signal pad.
//
// # Rendezvous protocol (all ranks call it, in the same order per group)
//
//  1. at the group's first rendezvous in this process only, each rank opens
//     a listening socket for the group (abstract Unix seqpacket), then
//     publishes its pid, start time, pid namespace, uid, hostname, backend
//     and socket name under symm/<group>/link<n>/<rank> and reads every
//     peer's: one all-gather through the store (one round trip on a
//     Client), checked (one host, one uid, one pid namespace, one backend).
//     Then rank i connects to every rank j > i at the name j published and
//     accepts every rank j < i; each connection is checked, before anything
//     is sent on it, to end at the process that published that rank (its
//     pid and uid from SO_PEERCRED, fixed by the kernel; its start time
//     from /proc), and the listener closes. The connections and what was
//     gathered are the group's link (link.go), kept for later handshakes
//     until the group's store is closed;
//  2. each rank sends one note to every peer on its connection: its block's
//     metadata (device, sizes, sync-area state) with the block's descriptor
//     (SCM_RIGHTS; exported once per block, at Alloc on CUDA), and takes
//     one from each; a note on rank j's connection must say it is rank j's;
//  3. each rank imports and maps every peer's descriptor as it comes, in
//     parallel, and closes it, then checks every rank's metadata (same
//     sizes, distinct devices): every rank reads the same notes, so all
//     judge alike;
//  4. each rank sends its outcome (done, or its error) to every peer and
//     waits for theirs: every rank succeeds, or every rank fails and names
//     the rank that failed first.
//
// So a rendezvous after the group's first touches no store: two messages
// per peer each way. A descriptor leaves this process only on a checked
// connection: a process that takes a published name later, or that writes
// a rank's metadata into the store first, gets nothing (docs/RELIABILITY.md:
// untrusted peers). A connection delivers in order and keeps what a peer
// sent after it exits, so a failing rank's cause arrives before its end;
// notes of a handshake that has ended (failed) here are dropped as they
// arrive, their descriptors closed.
//
// A peer that dies or stalls makes the others fail with an error naming its
// rank and pid within the timeout; nothing stays mapped or open after a
// failed rendezvous.
//
// # Signals
//
// Signal pads are arrays of uint32 slots: slot channel*world+src of rank
// dst's pad is set to 1 by src (put_signal) and waited for, then reset to 0,
// by dst (wait_signal), as PyTorch's pads are. On CUDA the operations are
// kernels where NVRTC can build them and SYMM_SIGNALS allows
// (kernelsig.go), else stream memory operations (cuStreamWriteValue32 /
// cuStreamWaitValue32) on the peer-mapped pads; on the host backend,
// atomics. A handle's way is chosen on its first signal and kept
// (signals.go).
//
// A handle's signals start over with ResetSignalPad (padreset.go): every
// rank waits for its device, the ranks agree, each zeroes its own pad, and
// the ranks agree again, so that no signal still on its way lands in a pad
// already cleared.
//
// # Settings and providers
//
// ConfigFromEnv (config.go) reads every SYMM_* setting of symmetric memory
// once and BackendFromEnv chooses the backend; NewProvider makes its
// provider. What differs between providers is a capability (provider.go:
// Peering, PeerMapper, Registrar, Bootstrapper, LabelDevices, Zeroer,
// Quiescer, DeviceArrays; streamMarker and kernelDevice inside the
// package), never a test of the provider's name.
//
// Multicast is never used: HasMulticastSupport is false.
//
// # Files
//
// Blocks (buffer + signal pad + sync area) and the block registry (interval
// lookup): block.go; the settings, read once, and the choice of backend:
// config.go; providers: provider.go (the interface and its capabilities), host
// (memfd) in it, cuda.go (VMM), nvshmem.go (the symmetric heap, peers through
// nvshmem_ptr), nccl.go (ncclMemAlloc and windows, peers through the cuda
// descriptor path).
//
// The rendezvous handshake: rendezvous.go; a group's link: link.go (one
// checked connection per peer, made once through the store), linkconn.go (a
// connection), notes.go (the handshakes' notes on it); the exchange of peers'
// blocks through it: exchange.go; meetings that carry their kind on the host:
// meeting.go; handles, their pointer arrays and lifetime: handle.go; a signal
// pad's reset on every rank: padreset.go.
//
// Signals: signals.go (put, wait and barrier over a signaler chosen once per
// handle), kernelsig.go (the kernels), watchdog.go (queued signals watched for
// their timeout). Collectives: allreduce.go (the one-shot), collectives.go
// (the two-shot, reduce-scatter, all-gather), push.go (the push all-reduce),
// choose.go (the choice of all-reduce); plan.go: a handle's launch plan for C
// (export/plans.h). Fault injection for tests: faults.go.
package symmetric
