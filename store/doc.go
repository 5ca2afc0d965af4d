// Package store is the key-value store a symmetric-memory rendezvous
// exchanges metadata through: each rank publishes a few hundred bytes under
// its own key and waits for the keys of the others.
//
// # Contract
//
// Every Store (Memory, Client, and the views Prefix makes) behaves the same:
//
//   - Keys are UTF-8 strings of at most 4 KiB; values are any bytes, at most
//     64 MiB. Anything else is refused with an error, and nothing changes.
//   - Set replaces the value and wakes every Get waiting for the key.
//   - Get returns the value once the key is set. It waits at most timeout
//     (timeout <= 0: it does not wait); then its error wraps ErrTimeout and
//     names the key and the time waited. A Set that lands while Get is giving
//     up may still be returned: a Get never misses a value that was there
//     when it returned a timeout.
//   - Add treats the value as a decimal ASCII integer, as c10d's TCPStore
//     does (a missing key counts as 0), stores the sum the same way and
//     returns it. A value that is not such an integer, or a sum outside int64,
//     is an error and leaves the value alone. Add wakes waiters like Set.
//   - Delete removes the key; deleting a missing key is not an error.
//   - Values are copied in and out: the caller may reuse its slices.
//   - Every method is safe for concurrent use. After Close, every call, and
//     every Get that was waiting, fails with an error wrapping ErrClosed.
//
// # Implementations
//
// Memory lives in one process (tests, a single-process group). Server holds
// a Memory and serves it over TCP to Clients in other processes, which is
// what C programs and multi-process tests use. Prefix gives a group its own
// key space inside a shared store. Count wraps any Store and counts the
// requests, round trips and bytes its user sends through it (Traffic),
// without changing what is sent: an all-gather stays one batch on a Client.
//
// A Client has one connection and never reconnects: once the connection is
// lost (the server closed or died), every pending and later call fails with
// an error that wraps ErrClosed and names the server's address. Calls on one
// Client are pipelined: a Get waiting for a key does not hold up a Set from
// another goroutine on the same Client. Each call also has a client-side
// deadline (its own wait plus a margin), so a server that hangs cannot hang
// the caller: the call fails with an error wrapping ErrTimeout.
//
// # Security
//
// A Server listens on loopback unless given another address. With a token
// (SYMM_STORE_TOKEN) every connection must present it before anything else;
// it is compared in constant time, and a connection that fails gets an error
// reply and is closed without seeing any data. Until it has authenticated, a
// connection may send only small frames and has 10 s to do so. A malformed
// frame from any connection closes that connection only; the server and its
// other clients go on. The wire format is described in frame.go.
//
// Files: store.go (the interface), memory.go (Memory), server.go and client.go
// (TCP), frame.go (the wire format), gather.go (the all-gather), counting.go
// (Count).
package store
