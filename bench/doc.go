// Package bench holds libsymm's benchmarks that need no GPU: the replay of a
// real training trace through the pool (trace_test.go). GPU benchmarks are
// bench_torch.py; figures go to RESULTS.md.
package bench
