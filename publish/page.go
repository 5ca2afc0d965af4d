package publish

import (
	"encoding/binary"
	"fmt"
	"strings"
)

const (
	magic          = "SYMMPUB1"
	version        = 2
	headerSize     = 384
	streamSlotSize = 40
	cmdlineSize    = 256
	backendSize    = 16
	offSeq         = 32
	offID          = 368
	offPIDNS       = 376
	// MaxStreams is how many streams (and pools) per device a page lists;
	// the rest are summed into the device's statistics only.
	MaxStreams = 16
	// bounds a reader accepts, so that a corrupt page cannot make it
	// allocate without limit.
	maxDevices = 64
	maxStats   = 4096
	maxSize    = 16 << 20
)

// Stream is one stream's (and pool's) part of a device's pool.
type Stream struct {
	Stream    uint64 `json:"stream"`
	Private   bool   `json:"private_pool"`
	Allocated int64  `json:"allocated_bytes"`
	Reserved  int64  `json:"reserved_bytes"`
	Segments  int64  `json:"segments"`
}

// Device is what a process's pool holds on one device: its statistics by
// name (those of torch.cuda.memory_stats and libsymm's own) and its streams.
type Device struct {
	Index   int              `json:"device"`
	Stats   map[string]int64 `json:"stats"`
	Streams []Stream         `json:"streams"`
}

// Symmetric is the process's symmetric memory.
type Symmetric struct {
	Blocks       int    `json:"blocks"`
	Bytes        uint64 `json:"bytes"`
	Handles      int    `json:"handles"`
	PeerMappings int    `json:"peer_mappings"`
}

// Page is one process's published statistics.
type Page struct {
	PID   int    `json:"pid"`
	UID   int    `json:"uid"`
	Start uint64 `json:"start_ticks"`
	// ID is the page's random identity, as in its file name (hex).
	ID string `json:"page_id"`
	// PIDNamespace is the inode of the writer's pid namespace (0: unknown);
	// OtherNamespace is set by List when it is not the reader's, so PID is
	// not a pid of the reader's /proc.
	PIDNamespace   uint64 `json:"pid_namespace"`
	OtherNamespace bool   `json:"other_pid_namespace,omitempty"`

	Updated   int64     `json:"updated_unix_ns"`
	Interval  int       `json:"interval_ms"`
	Backend   string    `json:"backend"`
	Command   string    `json:"command"`
	Devices   []Device  `json:"devices"`
	Symmetric Symmetric `json:"symmetric"`
}

// layout is where a page's parts lie, from its counts.
type layout struct {
	ndev, nstats, nstreams int
	devSize, namesOff      int
}

func newLayout(ndev, nstats, nstreams int) layout {
	l := layout{ndev: ndev, nstats: nstats, nstreams: nstreams}
	l.devSize = nstats*8 + 8 + nstreams*streamSlotSize
	l.namesOff = headerSize + ndev*l.devSize
	return l
}

func (l layout) devOff(i int) int { return headerSize + i*l.devSize }

// encodeNames joins names NUL-separated.
func encodeNames(names []string) []byte {
	return []byte(strings.Join(names, "\x00"))
}

// Parse decodes a page read whole into b. It checks every count and offset
// against b's length and the bounds above, so that any input gives a Page
// or an error naming what is wrong, never a panic.
func Parse(b []byte) (*Page, error) {
	le := binary.LittleEndian
	if len(b) < headerSize {
		return nil, fmt.Errorf("%d bytes, shorter than the %d-byte header", len(b), headerSize)
	}
	if string(b[:8]) != magic {
		return nil, fmt.Errorf("not a libsymm statistics page (magic %q)", b[:8])
	}
	if v := le.Uint32(b[8:]); v != version {
		return nil, fmt.Errorf("page version %d, this reader knows %d", v, version)
	}
	if n := le.Uint32(b[12:]); int(n) != len(b) {
		return nil, fmt.Errorf("page says %d bytes, file has %d", n, len(b))
	}
	ndev, nstats, nstreams := int(le.Uint32(b[52:])), int(le.Uint32(b[56:])), int(le.Uint32(b[60:]))
	if ndev > maxDevices || nstats > maxStats || nstreams > MaxStreams {
		return nil, fmt.Errorf("page lists %d devices, %d statistics and %d stream slots (at most %d, %d, %d)",
			ndev, nstats, nstreams, maxDevices, maxStats, MaxStreams)
	}
	l := newLayout(ndev, nstats, nstreams)
	namesOff, namesLen := int(le.Uint32(b[360:])), int(le.Uint32(b[364:]))
	if namesOff != l.namesOff || namesOff+namesLen != len(b) {
		return nil, fmt.Errorf("statistic names at %d+%d, want %d up to the end (%d bytes)", namesOff, namesLen, l.namesOff, len(b))
	}
	names := strings.Split(string(b[namesOff:]), "\x00")
	if nstats == 0 {
		names = nil
	}
	if len(names) != nstats {
		return nil, fmt.Errorf("page has %d statistic names for %d statistics", len(names), nstats)
	}
	p := &Page{
		PID: int(le.Uint32(b[16:])), UID: int(le.Uint32(b[20:])), Start: le.Uint64(b[24:]),
		ID: formatID(le.Uint64(b[offID:])), PIDNamespace: le.Uint64(b[offPIDNS:]),
		Updated: int64(le.Uint64(b[40:])), Interval: int(le.Uint32(b[48:])),
		Backend: cstr(b[64 : 64+backendSize]), Command: cstr(b[80 : 80+cmdlineSize]),
		Symmetric: Symmetric{
			Blocks: int(le.Uint32(b[336:])), Handles: int(le.Uint32(b[340:])), PeerMappings: int(le.Uint32(b[344:])),
			Bytes: le.Uint64(b[352:]),
		},
	}
	for i := 0; i < ndev; i++ {
		o := l.devOff(i)
		d := Device{Index: i, Stats: make(map[string]int64, nstats)}
		for j, n := range names {
			d.Stats[n] = int64(le.Uint64(b[o+8*j:]))
		}
		o += 8 * nstats
		used := int(le.Uint32(b[o:]))
		if used > nstreams {
			return nil, fmt.Errorf("device %d: %d streams in use, %d slots", i, used, nstreams)
		}
		o += 8
		for k := 0; k < used; k++ {
			s := b[o+k*streamSlotSize:]
			d.Streams = append(d.Streams, Stream{
				Stream: le.Uint64(s), Private: le.Uint64(s[8:])&1 != 0,
				Allocated: int64(le.Uint64(s[16:])), Reserved: int64(le.Uint64(s[24:])), Segments: int64(le.Uint64(s[32:])),
			})
		}
		p.Devices = append(p.Devices, d)
	}
	return p, nil
}

// cstr is b up to its first NUL.
func cstr(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
