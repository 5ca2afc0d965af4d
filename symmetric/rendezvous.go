package symmetric

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/libsymm/libsymm/kernels"
	"github.com/libsymm/libsymm/store"
)

// Group is what a rendezvous needs to know about the ranks taking part.
type Group struct {
	Name  string // unique per group: "0" for WORLD in PyTorch, or any label
	Rank  int
	World int
	Store store.Store
}

// meta is what each rank publishes.
type meta struct {
	PID      int    `json:"pid"`
	UID      int    `json:"uid"`
	Host     string `json:"host"`
	Provider string `json:"provider"`
	Dev      int    `json:"dev"`
	DevID    string `json:"dev_id,omitempty"` // Peering.DeviceID: the same in every process
	Size     uint64 `json:"size"`
	Block    uint64 `json:"block"`
	Socket   string `json:"socket"`
	PE       int    `json:"pe"` // PeerMapper.PeerID (NVSHMEM's PE); 0 otherwise
	// SyncFree: no group owns this rank's block's sync area yet.
	SyncFree bool `json:"sync_free,omitempty"`
	// Blocks is this rank's Config.CollectiveBlocks (0: the default).
	Blocks int `json:"blocks,omitempty"`
	// Kernels: this rank could reset the pad by kernel barriers
	// (Manager.kernelsForReset).
	Kernels bool `json:"kernels,omitempty"`
	// Start and PIDNS name the process with PID (a group's link checks its
	// connections against them): its start time, and its pid namespace.
	Start uint64 `json:"start,omitempty"`
	PIDNS string `json:"pidns,omitempty"`
}

// Rendezvous maps every rank's block of group g into this process and
// returns the handle. ptr is any address inside this rank's block. Calling it
// again for the same block and group returns the same handle.
func (m *Manager) Rendezvous(ptr uintptr, g Group) (*Handle, error) {
	if g.World < 1 || g.Rank < 0 || g.Rank >= g.World || g.Name == "" || g.Store == nil {
		return nil, fmt.Errorf("%w: rendezvous needs 0 <= rank < world, a group name and a store (rank %d, world %d, group %q)",
			ErrInvalid, g.Rank, g.World, g.Name)
	}
	if g.World > kernels.PadSlots {
		return nil, fmt.Errorf("%w: world size %d exceeds the signal pad's %d slots", ErrInvalid, g.World, kernels.PadSlots)
	}
	b, _, err := m.Find(ptr)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return nil, fmt.Errorf("%w: block %#x was freed", ErrUnknownPointer, b.Ptr())
	}
	if h := b.handles[g.Name]; h != nil {
		if h.rank != g.Rank || h.world != g.World {
			return nil, fmt.Errorf("%w: block %#x was rendezvoused with group %q as rank %d of %d, now asked as rank %d of %d",
				ErrInvalid, b.Ptr(), g.Name, h.rank, h.world, g.Rank, g.World)
		}
		return h, nil
	}
	h, err := m.rendezvous(b, g)
	if err != nil {
		return nil, fmt.Errorf("rendezvous of group %q (rank %d of %d): %w", g.Name, g.Rank, g.World, err)
	}
	b.handles[g.Name] = h
	m.count(1, h.usage())
	return h, nil
}

// nextSeq numbers the handshakes of one kind of one group in this
// process. Every rank joins a group's blocks in the same order, and takes
// the number of a handshake that uses the group's link under the link's
// lock (so two threads number theirs in the order they run them), so the
// numbers agree across ranks and keep one handshake's notes (or store keys)
// apart from another's.
func (m *Manager) nextSeq(group string, kind hsKind) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := seqKey{group, kind}
	m.seq[k]++
	return m.seq[k]
}

// handshake is one rendezvous in progress: what its steps share. The steps,
// in order (doc.go: the protocol): find the group's link, made at its
// first rendezvous (linkFor: link.go), take our block's descriptor
// (exported at Alloc), send our metadata and descriptor to every peer and
// map theirs as they come (exchange: exchange.go), check every rank's
// metadata (validate), build the pointer arrays, agree on the outcome
// (agree "done"), register with the provider (register). A handle's later
// group steps (its signal pad's reset) run as a handshake of their own over
// the same link.
// A rank that fails tells its peers on the group's link, so that none
// waits for it until the timeout; from the agreement on, every rank
// succeeds or every rank fails, naming the rank that failed first.
type handshake struct {
	m        *Manager
	b        *Block
	g        Group
	kind     hsKind // the counter that numbers the handshake: kindRendezvous or kindPadReset
	seq      int64  // its number, the same on every rank
	deadline time.Time
	tr       *tracer
	ln       *link   // the group's link, locked for the handshake
	metas    []meta  // every rank's, once exchanged
	h        *Handle // the handle being made
}

// rendezvous joins b with g. Nothing stays mapped or open after a failure
// but the group's link.
func (m *Manager) rendezvous(b *Block, g Group) (_ *Handle, err error) {
	kernelsReady := m.kernelsForReset(b) // before the deadline: a compile takes time
	r := &handshake{m: m, b: b, g: g, kind: kindRendezvous, deadline: time.Now().Add(m.cfg.Timeout), tr: newTracer(m.cfg.Trace, g)}
	defer r.tr.done()
	pm, mapped := m.prov.(PeerMapper) // peers are mapped already: nothing to export
	me, err := m.ownMeta(b, pm, mapped)
	if err != nil {
		return nil, err
	}
	me.SyncFree = b.syncOwner == "" // b.mu is held (Rendezvous)
	me.Blocks = m.cfg.CollectiveBlocks
	me.Kernels = kernelsReady
	m.crashAt("publish")
	if beforeLink != nil {
		beforeLink(g)
	}
	var made bool
	if r.ln, made, err = m.linkFor(g, r.deadline); err != nil {
		return nil, err
	}
	defer r.ln.mu.Unlock()
	r.seq = m.nextSeq(g.Name, kindRendezvous) // under the link's lock
	defer r.end()
	defer func() {
		// A group's first rendezvous that fails leaves no link: it fails on
		// every rank, so every rank makes the link again at the next one.
		if err != nil && made {
			r.ln.closeLocked()
		}
	}()
	me.Socket = r.ln.peers[g.Rank].Socket
	r.tr.mark("link")
	m.crashAt("gathered")
	fd := -1
	if !mapped {
		if fd, err = m.exportedFD(b); err != nil {
			err = fmt.Errorf("exporting the block: %w", err)
			r.tellFailure(err)
			return nil, err
		}
		r.tr.mark("export")
	}
	h := &Handle{m: m, b: b, group: g.Name, rank: g.Rank, world: g.World, peers: make([]*Mem, g.World), store: g.Store}
	r.h = h
	h.startArrays()
	defer func() {
		if err != nil { // nothing stays mapped after a failed rendezvous
			h.release()
		}
	}()
	if err = r.agree("done", r.mapPeers(pm, mapped, me, fd)); err != nil {
		return nil, err
	}
	r.tr.mark("completion")
	if err = r.register(); err != nil {
		return nil, err
	}
	// The group meets through the sync area only if it is free on every
	// rank: every rank reads the same metas, so all decide alike.
	h.epochSync, h.maxBlocks = true, uint32(padChannels(g.World))
	h.resetOnGPU = true
	for _, p := range r.metas {
		h.epochSync = h.epochSync && p.SyncFree
		h.maxBlocks = min(h.maxBlocks, uint32(collectiveBlocks(p.Blocks)))
		h.resetOnGPU = h.resetOnGPU && p.Kernels
	}
	h.resetOnGPU = h.resetOnGPU && h.epochSync
	if h.epochSync {
		b.syncOwner = g.Name
	}
	return h, nil
}

// exported is the outcome of exporting a block's descriptor.
type exported struct {
	fd  int
	err error
}

// startExport exports b's descriptor in the background: the driver takes
// up to a millisecond, which the caller's work between Alloc and the
// rendezvous hides. b.export holds the outcome until exportedFD or Free
// takes it.
func (m *Manager) startExport(b *Block) {
	b.export = make(chan exported, 1)
	go func() {
		fd, err := m.prov.Export(b.mem)
		b.export <- exported{fd, err}
	}()
}

// exportedFD returns b's exported descriptor (b.mu held), waiting for the
// background export, or exporting again if that one failed. The block
// keeps it until it is freed.
func (m *Manager) exportedFD(b *Block) (int, error) {
	if b.export != nil {
		e := <-b.export
		b.export = nil
		if e.err == nil {
			b.exportFD = e.fd
		}
	}
	if b.exportFD < 0 {
		fd, err := m.prov.Export(b.mem)
		if err != nil {
			return -1, err
		}
		b.exportFD = fd
	}
	return b.exportFD, nil
}

// ownMeta is what this rank sends of its block.
func (m *Manager) ownMeta(b *Block, pm PeerMapper, mapped bool) (me meta, err error) {
	host, _ := os.Hostname()
	me = meta{PID: os.Getpid(), UID: os.Getuid(), Host: host, Provider: m.prov.Name(), Dev: b.Dev(),
		Size: b.bufSize, Block: b.mem.Size}
	if p, ok := m.prov.(Peering); ok {
		if me.DevID, err = p.DeviceID(b.Dev()); err != nil {
			return me, fmt.Errorf("naming device %d: %w", b.Dev(), err)
		}
	}
	if mapped {
		if me.PE, err = pm.PeerID(); err != nil {
			return me, err
		}
	}
	return me, nil
}

// mapPeers maps every peer's block into the handle, through the provider
// (mapped) or by exchanging descriptors (fd: ours), checks every rank's
// metadata, then builds the handle's pointer arrays.
func (r *handshake) mapPeers(pm PeerMapper, mapped bool, me meta, fd int) error {
	h := r.h
	err := r.exchange(pm, mapped, me, fd)
	r.tr.mark(fmt.Sprintf("exchange descriptors + map (of which import+map %.3fms)", float64(h.importTime.Load())/1e6))
	r.m.crashAt("mapped")
	if err != nil {
		return err
	}
	// Before the agreement: a rank that cannot build its arrays fails
	// together with every other.
	if err = r.m.failAt("arrays"); err == nil {
		err = h.buildArrays()
	}
	r.tr.mark("pointer arrays")
	return err
}

// register registers b with providers that need it (Registrar: an NCCL
// window), a collective: only after every rank has completed, so that it
// cannot hang on a rank that failed before.
func (r *handshake) register() error {
	h := r.h
	reg, ok := r.m.prov.(Registrar)
	if !ok {
		return nil
	}
	err := r.m.failAt("register")
	if err == nil {
		h.unregister, err = reg.Register(r.b.mem, r.g.Rank, r.g.World)
	}
	if err != nil {
		err = fmt.Errorf("registering the block with %s: %w", r.m.prov.Name(), err)
	}
	// A second agreement: the registration can fail on one rank after all
	// agreed on the completion; then every rank fails, naming it.
	if err = r.agree("registered", err); err != nil {
		return err
	}
	r.tr.mark("registration")
	return nil
}

// tracer prints phase durations of one rendezvous when enabled.
type tracer struct {
	on     bool
	g      Group
	start  time.Time
	last   time.Time
	phases []string
}

func newTracer(on bool, g Group) *tracer {
	now := time.Now()
	return &tracer{on: on, g: g, start: now, last: now}
}

func (t *tracer) mark(phase string) {
	if !t.on {
		return
	}
	now := time.Now()
	t.phases = append(t.phases, fmt.Sprintf("%s %.3fms", phase, float64(now.Sub(t.last).Microseconds())/1e3))
	t.last = now
}

func (t *tracer) done() {
	if t.on {
		fmt.Fprintf(os.Stderr, "symm: rendezvous %q rank %d/%d: %.3fms: %s\n", t.g.Name, t.g.Rank, t.g.World,
			float64(time.Since(t.start).Microseconds())/1e3, strings.Join(t.phases, ", "))
	}
}

// validate checks that the ranks' blocks can be joined, naming the rank that
// differs from rank 0 or from us.
func (m *Manager) validate(g Group, metas []meta) error {
	me := metas[g.Rank]
	if err := sameKind(g.Rank, metas); err != nil {
		return err
	}
	devs := map[string]int{}
	// Labels of one memory (host "devices") may repeat: only real devices must differ.
	_, labels := m.prov.(LabelDevices)
	for j, p := range metas {
		switch {
		case p.Size != me.Size:
			return fmt.Errorf("rank %d's buffer is %d bytes, rank %d's is %d: every rank must allocate the same size", j, p.Size, g.Rank, me.Size)
		case p.Block != me.Block:
			return fmt.Errorf("rank %d's block is %d bytes, rank %d's is %d", j, p.Block, g.Rank, me.Block)
		}
		if !labels && !m.cfg.AllowOverlappingDevices {
			id := p.DevID
			if id == "" {
				id = fmt.Sprint(p.Dev)
			}
			if k, dup := devs[id]; dup {
				return fmt.Errorf("ranks %d and %d both use device %s (set SYMM_ALLOW_OVERLAPPING_DEVICES=1 to allow it)", k, j, id)
			}
			devs[id] = j
		}
	}
	return m.checkPaths(metas)
}

// checkPaths refuses a group in which one rank's device cannot map
// another's, for every pair this process can judge (so that every rank
// that sees the same devices refuses the same way, before any exchange).
func (m *Manager) checkPaths(metas []meta) error {
	p, ok := m.prov.(Peering)
	if !ok {
		return nil
	}
	for i, a := range metas {
		for j, b := range metas {
			if i != j && a.DevID != "" && b.DevID != "" && a.DevID != b.DevID {
				if err := p.CanMap(a.DevID, b.DevID); err != nil {
					return fmt.Errorf("rank %d cannot map rank %d's block: %w", i, j, err)
				}
			}
		}
	}
	return nil
}

// HasMulticastSupport is always false: libsymm never creates multicast objects.
func HasMulticastSupport() bool { return false }

// WorldWithinDirectAccess reports whether every rank of g, each on its
// device dev, can map every other rank's device memory (P2P over NVLink or
// PCIe), so that a rendezvous of the group can succeed. Every rank of g must
// call it; all get the same answer (each rank judges the pairs it can see,
// then the verdicts are gathered). The host backend always answers true.
func (m *Manager) WorldWithinDirectAccess(dev int, g Group) (bool, error) {
	if err := m.checkDevice(dev, 0); err != nil {
		return false, err
	}
	if g.World < 1 || g.Rank < 0 || g.Rank >= g.World || g.Name == "" || g.Store == nil {
		return false, fmt.Errorf("%w: world_within_direct_access needs 0 <= rank < world, a group name and a store (rank %d, world %d, group %q)",
			ErrInvalid, g.Rank, g.World, g.Name)
	}
	p, ok := m.prov.(Peering)
	if !ok {
		return true, nil
	}
	id, err := p.DeviceID(dev)
	if err != nil {
		return false, fmt.Errorf("naming device %d: %w", dev, err)
	}
	prefix := fmt.Sprintf("symm/%s/access%d/", g.Name, m.nextSeq(g.Name, kindAccess))
	ids, err := store.AllGather(g.Store, prefix+"dev/", g.Rank, g.World, []byte(id), m.cfg.Timeout)
	if err != nil {
		return false, fmt.Errorf("world_within_direct_access of group %q: gathering devices: %w", g.Name, err)
	}
	verdict := []byte{1}
	for i := range ids {
		for j := range ids {
			if i != j && p.CanMap(string(ids[i]), string(ids[j])) != nil {
				verdict[0] = 0
			}
		}
	}
	votes, err := store.AllGather(g.Store, prefix+"ok/", g.Rank, g.World, verdict, m.cfg.Timeout)
	if err != nil {
		return false, fmt.Errorf("world_within_direct_access of group %q: gathering verdicts: %w", g.Name, err)
	}
	for _, v := range votes {
		if len(v) != 1 || v[0] != 1 {
			return false, nil
		}
	}
	return true, nil
}
