// Package symmetric is libsymm's symmetric memory: each rank of a group
// allocates a block of exportable memory; a rendezvous maps every peer's
// block into every rank's address space, so one device reads and writes its
// peers' buffers directly. It follows PyTorch's
// torch/csrc/distributed/c10d/symm_mem/ (CUDA backend) in layout and
// semantics.
//
// # Blocks
//
// A block is [buffer | signal pad]: the buffer starts at the block (so the
// pointer PyTorch's MemPool gets is the buffer), the signal pad of
// SignalPadSize bytes starts at the buffer size rounded up to 16 bytes. A
// block belongs to no group until it is rendezvoused; it can be rendezvoused
// with several groups, each giving its own Handle.
//
// # Rendezvous protocol (all ranks call it, in the same order per group)
//
//  1. each rank publishes its metadata (pid, uid, device, hostname, sizes,
//     socket names) under <group>/<seq>/meta/<rank> in the store;
//  2. each rank reads every peer's metadata (waiting at most the timeout) and
//     checks it: same host, same buffer size, distinct devices (CUDA);
//  3. file descriptors: rank i listens on one abstract Unix socket per peer
//     j and hands its block's descriptor to the process that connects there,
//     only if its SO_PEERCRED pid is j's and its uid ours (package ipc);
//  4. each rank imports and maps every peer's descriptor, closes it, and
//     marks itself done; the rendezvous ends when every rank is done.
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
// stream memory operations (cuStreamWriteValue32 / cuStreamWaitValue32)
// on the peer-mapped pads; on the host backend, atomics.
//
// Multicast is never used: HasMulticastSupport is false.
package symmetric
