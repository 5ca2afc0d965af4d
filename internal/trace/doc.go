// Package trace reads allocation traces (the CSV that python -m symm.trace
// writes from a PyTorch memory snapshot) and replays them through libsymm's
// pool on a virtual backend, so that anyone can measure what the pool's
// configurations would reserve for their own workload without a GPU.
//
// # Format
//
// The first line is the header "action,addr,size,stream"; every other line is
// one event with those four columns: an action (see Action), then three
// non-negative decimal integers. addr is only an identity pairing an alloc
// with its free; stream is the stream the block belongs to (a cudaStream_t).
// Blank lines are skipped and spaces around fields are ignored. docs/REPLAY.md
// describes the format and what Replay does with each action.
//
// Files: trace.go (the format: reading and writing), play.go (which rows pair
// up, shared by the trace's own peaks and the replay), replay.go (Replay
// through a Pool over allocator.Virtual, for symm replay and
// bench/trace_test.go), series.go (memory over a trace, for charts).
package trace
