package allocator

import "sync/atomic"

// Shards: one per (device, stream) of the default pool and kind of segment
// (fixed or expandable: a program may switch between them while it runs,
// tunables.go), found without a lock through a table per kind that grows by
// copying (shardTable says why that is safe).

// shardTable is an open-addressed table from stream to shard, read without
// locks. Slots only ever go from nil to a shard; a full table is replaced by
// a larger copy under device.mu.
type shardTable struct {
	slots []atomic.Pointer[shard]
	n     int // under device.mu
}

func streamHash(stream uintptr, mask int) int {
	return int((uint64(stream) * 0x9E3779B97F4A7C15) >> 32 & uint64(mask))
}

func (t *shardTable) lookup(stream uintptr) *shard {
	mask := len(t.slots) - 1
	for i := streamHash(stream, mask); ; i = (i + 1) & mask {
		s := t.slots[i].Load()
		if s == nil || s.stream == stream {
			return s
		}
	}
}

func (t *shardTable) insert(s *shard) {
	mask := len(t.slots) - 1
	i := streamHash(s.stream, mask)
	for t.slots[i].Load() != nil {
		i = (i + 1) & mask
	}
	t.slots[i].Store(s)
	t.n++
}

// segKind indexes device.tables: the default pool's shards of fixed
// segments (0) and of expandable ones (1).
func segKind(expandable bool) int {
	if expandable {
		return 1
	}
	return 0
}

// lookupKind returns the shard of stream serving segments of kind x, or nil
// if the stream never allocated such segments here.
func (d *device) lookupKind(stream uintptr, x int) *shard {
	if t := d.tables[x].Load(); t != nil {
		return t.lookup(stream)
	}
	return nil
}

// lookup returns the shard of stream that new requests go to (the kind of
// segment the setting names now), or nil if there is none yet.
func (d *device) lookup(stream uintptr) *shard {
	return d.lookupKind(stream, segKind(d.pool.Expandable()))
}

func (d *device) shardFor(stream uintptr) *shard {
	x := segKind(d.pool.Expandable())
	if s := d.lookupKind(stream, x); s != nil {
		return s
	}
	return d.newShard(stream, x)
}

func (d *device) newShard(stream uintptr, x int) *shard {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.lookupKind(stream, x); s != nil {
		return s
	}
	s := &shard{dev: d, stream: stream, src: d.sourceFor(nil, x == 1), epoch: newEpochCell()}
	for k := range s.bins {
		s.bins[k].highTies = s.src.grows()
	}
	// On the list first: at the second shard the device switches to
	// device-wide counters, before anyone can find s in the table.
	d.appendShard(s)
	t := d.tables[x].Load()
	if t == nil || 2*(t.n+1) > len(t.slots) {
		size := 16
		if t != nil {
			size = 2 * len(t.slots)
		}
		nt := &shardTable{slots: make([]atomic.Pointer[shard], size)}
		for _, o := range *d.list.Load() {
			if o.pool == nil && segKind(o.src.grows()) == x {
				nt.insert(o) // s among them
			}
		}
		d.tables[x].Store(nt)
	} else {
		t.insert(s)
	}
	return s
}

func (d *device) shardList() []*shard { return *d.list.Load() }
