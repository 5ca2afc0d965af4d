// Package bench holds libsymm's benchmarks. The Go part needs no GPU:
// trace_test.go replays the recorded traces (testdata/*.csv.gz: GPT-2
// training, ResNet-50 training with varying batches, LLM inference with a
// growing KV cache, FSDP2 GPT-2 on 2 GPUs) through the pool. The others
// are programs and scripts beside it; the figures, with the date, device,
// commit and command of each, are in RESULTS.md (older ones in HISTORY.md).
//
// PyTorch, on a GPU:
//
//   - bench_torch.py: PyTorch's entry points on native, libsymm, RAPIDS RMM
//     (installed by rmm_setup.sh) and cudaMalloc; its C++ timing loops in
//     torch_ext/bench_torch.cpp.
//   - bench_paired.py: the same entry points, native against libsymm in
//     alternating slices of tens of milliseconds on one CPU, so that the
//     host's changes of speed fall on both sides; the protocol in
//     pairing.py.
//   - bench_graphs.py: 1,000 replays of a captured training step, native
//     against libsymm.
//   - replay_torch.py: the recorded traces replayed through PyTorch's
//     allocator API, per call and peak, native and libsymm in both modes;
//     its loop in torch_ext/replay_torch.cpp. replay_paired.py: the same
//     replays, the configurations in alternating slices.
//   - fsdp.py: FSDP2 GPT-2 training on 2 or more GPUs under torchrun, for
//     each allocator mode: peaks, step time, losses; --record-trace writes
//     each rank's multi-stream trace.
//   - workloads.py: GPT-2, ResNet-50 and LLM inference runs: peak device
//     memory and step time.
//
// The front cache, any backend: front_paired.py (on against off on the
// recorded traces, paired as above, with the peaks of each), front_cache.sh
// (the same with whole passes) and front_variants.sh (what relaxing its
// rules costs in bytes and saves in time).
//
// C, any backend: c/bench_threads.c (thread scaling of the cached path),
// c/bench_trace.c (a trace through the C API; --serve times passes on
// request), c/bench_launch.c (the signals' and collectives' entry points
// beside the driver's own launch, GPU).
package bench
