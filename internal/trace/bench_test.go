package trace

import (
	"fmt"
	"testing"

	"github.com/libsymm/libsymm/allocator"
)

// BenchmarkPoolOnTrace times the Go pool alone (no front cache, no cgo) on
// each recorded trace's alloc and free_completed rows, on a pool already
// warmed by one pass; ns/call counts the frees of blocks still live at the
// end of a pass as calls too. What a call costs in Go on a real workload, as
// opposed to a loop of one size (allocator's BenchmarkCachedAllocFree);
// profile it with -cpuprofile.
func BenchmarkPoolOnTrace(b *testing.B) {
	for _, name := range []string{"gpt2_train", "cnn_train", "llm_infer"} {
		for _, exp := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/expandable=%v", name, exp), func(b *testing.B) {
				ops := compileOps(b, "../../bench/testdata/"+name+"_trace.csv.gz")
				p, err := allocator.New(allocator.NewVirtual(1, 0), allocator.Config{Expandable: exp})
				if err != nil {
					b.Fatal(err)
				}
				live := make([]uintptr, ops.slots)
				pass := func() {
					for _, o := range ops.ops {
						if o.alloc {
							ptr, _, err := p.Alloc(0, 0, o.size)
							if err != nil {
								b.Fatal(err)
							}
							live[o.slot] = ptr
						} else if err := p.Free(0, 0, live[o.slot], o.size); err != nil {
							b.Fatal(err)
						}
					}
					for _, s := range ops.liveAtEnd {
						if err := p.Free(0, 0, live[s], ops.sizes[s]); err != nil {
							b.Fatal(err)
						}
					}
				}
				pass()
				b.ResetTimer()
				calls := 0
				for calls < b.N { // b.N counts calls: whole passes until at least b.N
					pass()
					calls += len(ops.ops)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(calls), "ns/call")
			})
		}
	}
}

type traceOp struct {
	alloc bool
	slot  int
	size  uint64
}

type traceOps struct {
	ops       []traceOp
	slots     int
	liveAtEnd []int
	sizes     map[int]uint64
}

// compileOps turns a trace's alloc and free_completed rows into slot
// operations (a slot per live block), as bench/c/bench_trace.c does.
func compileOps(b *testing.B, path string) traceOps {
	t, err := Open(path)
	if err != nil {
		b.Skip(err)
	}
	var out traceOps
	out.sizes = map[int]uint64{}
	slotOf := map[uint64]int{}
	var free []int
	for _, e := range t.Events {
		switch e.Action {
		case Alloc:
			if _, ok := slotOf[e.Addr]; ok {
				continue
			}
			var s int
			if n := len(free); n > 0 {
				s, free = free[n-1], free[:n-1]
			} else {
				s = out.slots
				out.slots++
			}
			slotOf[e.Addr] = s
			out.sizes[s] = e.Size
			out.ops = append(out.ops, traceOp{true, s, e.Size})
		case FreeCompleted:
			s, ok := slotOf[e.Addr]
			if !ok {
				continue
			}
			delete(slotOf, e.Addr)
			free = append(free, s)
			out.ops = append(out.ops, traceOp{false, s, out.sizes[s]})
		}
	}
	for _, s := range slotOf {
		out.liveAtEnd = append(out.liveAtEnd, s)
	}
	return out
}
