// Package bench holds libsymm's benchmarks that need no GPU: the replay of a
// real training trace through the pool (trace_test.go). The others are
// scripts beside it: bench_torch.py and bench_paired.py (PyTorch's entry
// points, GPU), replay_torch.py and replay_paired.py (the recorded traces
// through PyTorch, GPU), front_paired.py (the front cache on the recorded
// traces, any backend); figures go to RESULTS.md.
package bench
