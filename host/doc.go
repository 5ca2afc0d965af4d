// Package host serves libsymm's backend interfaces from host memory: each
// segment is a memfd mapped shared, so the same memory can later be passed to
// other processes as a file descriptor (symmetric memory). It lets the pool,
// the C ABI and the Python package run, unchanged, on machines without a GPU
// (CI, CPU programs). It is chosen explicitly (SYMM_DEVICE=host), never as a
// fallback: a host pointer handed to PyTorch as device memory would crash it.
//
// Streams and events: host memory has no asynchronous work, so every event
// is complete as soon as it is recorded.
//
// Fault injection (Backend.WithFaults, Faults; SYMM_HOST_FAULTS in the C
// library) makes operations fail at random, to test that a failing backend
// loses and leaks nothing.
//
// # Files
//
// host.go is the backend (memfd segments, events, symmetric blocks);
// expand.go its expandable segments: a range reserved PROT_NONE, chunks mapped
// into it with MAP_FIXED and unmapped by mapping PROT_NONE over them again;
// faults.go the fault injection.
package host
