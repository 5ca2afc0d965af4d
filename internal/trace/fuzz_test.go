package trace

import (
	"bytes"
	"slices"
	"testing"

	"github.com/libsymm/libsymm/allocator"
)

// FuzzParse checks that Parse never panics; that whatever it accepts, written
// back with WriteCSV, parses to the same events; and that any trace it
// accepts replays without error (out of memory is counted, never an error)
// and leaves the pool's invariants intact, with fixed and with expandable
// segments.
func FuzzParse(f *testing.F) {
	// The first rows of the real GPT-2 trace, and a few edge cases.
	f.Add([]byte("action,addr,size,stream\nalloc,139617127327744,8192,0\nalloc,139626680680448,3145728,0\n" +
		"alloc,139617127335936,1024,0\nalloc,139617127336960,1024,0\nfree_requested,139617127335936,1024,0\n" +
		"free_completed,139617127335936,1024,0\nsegment_alloc,139626635329536,20971520,0\n" +
		"alloc,139626635329536,9437184,0\n"))
	f.Add([]byte("action,addr,size,stream\r\nfree_completed,5,4096,7\r\nalloc,5,4096,7\r\nalloc,5,512,0\r\n"))
	f.Add([]byte("action, addr, size, stream\n\nsegment_map,1,2097152,0\nsegment_unmap,1,2097152,0\noom,0,1,0\nsnapshot,0,0,0"))
	f.Add([]byte("action,addr,size,stream\nalloc,1,18446744073709551615,0\nalloc,2,-1,0\n"))
	f.Add([]byte("alloc,1,2,3\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := Parse(bytes.NewReader(data))
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := tr.WriteCSV(&buf); err != nil {
			t.Fatal(err)
		}
		back, err := Parse(&buf)
		if err != nil {
			t.Fatalf("output of WriteCSV does not parse: %v\n%s", err, buf.String())
		}
		if a, b := withoutLines(tr.Events), withoutLines(back.Events); !slices.Equal(a, b) {
			t.Fatalf("round trip changed the events:\n%v\n%v", a, b)
		}
		tr.Recorded()
		for _, cfg := range []allocator.Config{{}, {Expandable: true}} {
			if _, err := Replay(tr, cfg, 64<<20); err != nil {
				t.Fatalf("replay (expandable %v): %v", cfg.Expandable, err)
			}
		}
	})
}
