package symmetric

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libsymm/libsymm/ipc"
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
}

// Rendezvous maps every rank's block of group g into this process and
// returns the handle. ptr is any address inside this rank's block. Calling it
// again for the same block and group returns the same handle.
func (m *Manager) Rendezvous(ptr uintptr, g Group) (*Handle, error) {
	if g.World < 1 || g.Rank < 0 || g.Rank >= g.World || g.Name == "" || g.Store == nil {
		return nil, fmt.Errorf("%w: rendezvous needs 0 <= rank < world, a group name and a store (rank %d, world %d, group %q)",
			ErrInvalid, g.Rank, g.World, g.Name)
	}
	if g.World*4 > SignalPadSize {
		return nil, fmt.Errorf("%w: world size %d exceeds the signal pad's %d slots", ErrInvalid, g.World, SignalPadSize/4)
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

// nextSeq numbers the rendezvous of one group in this process. Every rank
// joins a group's blocks in the same order, so the numbers agree across
// ranks and keep one rendezvous's keys in the store apart from another's.
func (m *Manager) nextSeq(group string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq[group]++
	return m.seq[group]
}

// handshake is one rendezvous in progress: what its steps share. The steps,
// in order (doc.go: the protocol): export our block in the background
// (startExport), open our mailbox (openMailbox), publish our metadata and
// gather every rank's (gatherMetas), check them (validate), map the peers
// into the handle (mapPeers: exchange.go), agree on the outcome (complete),
// register with the provider (register). A handle's later group steps (its
// signal pad's reset) run as a handshake of their own over the same group
// and metadata, without a mailbox.
// From the check on, a rank that fails tells its peers through their
// mailboxes, so that none waits for its descriptor until the timeout
// (ranks that see different devices may judge a group differently); from
// the agreement on, every rank succeeds or every rank fails, naming the
// rank that failed first.
type handshake struct {
	m        *Manager
	b        *Block
	g        Group
	prefix   string // symm/<group>/<seq>/: the rendezvous's keys in the store
	deadline time.Time
	tr       *tracer
	mb       *ipc.Mailbox
	metas    []meta  // every rank's, once gathered
	h        *Handle // the handle being made, once the metadata is in
}

// rendezvous joins b with g. Nothing stays mapped or open after a failure.
func (m *Manager) rendezvous(b *Block, g Group) (_ *Handle, err error) {
	r := &handshake{m: m, b: b, g: g, deadline: time.Now().Add(m.cfg.Timeout), tr: newTracer(m.cfg.Trace, g)}
	defer r.tr.done()
	pm, mapped := m.prov.(PeerMapper) // peers are mapped already: nothing to export
	exp := m.startExport(b, mapped)
	defer handOver(b, exp)
	seq := m.nextSeq(g.Name)
	r.prefix = fmt.Sprintf("symm/%s/%d/", g.Name, seq)
	me, err := m.ownMeta(b, pm, mapped)
	if err != nil {
		return nil, err
	}
	me.SyncFree = b.syncOwner == "" // b.mu is held (Rendezvous)
	me.Blocks = m.cfg.CollectiveBlocks
	if r.mb, err = openMailbox(&me, g, seq); err != nil {
		return nil, err
	}
	defer r.mb.Close()
	m.crashAt("publish")
	if err = r.gatherMetas(me); err != nil {
		return nil, err
	}
	fd, err := r.exported(exp)
	if err != nil {
		return nil, err
	}

	h := &Handle{m: m, b: b, group: g.Name, rank: g.Rank, world: g.World, peers: make([]*Mem, g.World),
		store: g.Store, metas: r.metas}
	r.h = h
	defer func() {
		if err != nil { // nothing stays mapped after a failed rendezvous
			h.release()
		}
	}()
	if err = r.complete(r.mapPeers(pm, mapped, fd)); err != nil {
		return nil, err
	}
	if err = r.register(); err != nil {
		return nil, err
	}
	// The group meets through the sync area only if it is free on every
	// rank: every rank reads the same metas, so all decide alike.
	h.epochSync, h.maxBlocks = true, uint32(SignalPadSize/4/g.World)
	for _, p := range r.metas {
		h.epochSync = h.epochSync && p.SyncFree
		h.maxBlocks = min(h.maxBlocks, uint32(collectiveBlocks(p.Blocks)))
	}
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

// startExport exports b's descriptor in the background, once per block:
// the driver takes about a millisecond, which the metadata's round trip
// hides. The channel holds the outcome until handOver takes it.
func (m *Manager) startExport(b *Block, mapped bool) chan exported {
	exp := make(chan exported, 1)
	if b.exportFD >= 0 || mapped {
		exp <- exported{fd: b.exportFD}
	} else {
		go func() {
			fd, err := m.prov.Export(b.mem)
			exp <- exported{fd, err}
		}()
	}
	return exp
}

// handOver gives the block the descriptor exported for it, whatever became
// of the rendezvous: the block keeps it until it is freed.
func handOver(b *Block, exp chan exported) {
	if e := <-exp; e.err == nil && b.exportFD < 0 {
		b.exportFD = e.fd
	}
}

// ownMeta is what this rank publishes, less its mailbox's name.
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

// gatherMetas publishes me, reads every rank's metadata into r.metas and
// checks it.
func (r *handshake) gatherMetas(me meta) error {
	g := r.g
	raw, _ := json.Marshal(me)
	vals, err := store.AllGather(g.Store, r.prefix+"meta/", g.Rank, g.World, raw, time.Until(r.deadline))
	if err != nil {
		var ge *store.GatherError
		switch {
		case errors.Is(err, store.ErrClosed):
			return fmt.Errorf("the store went away while gathering the ranks' metadata: %w", err)
		case errors.As(err, &ge):
			return fmt.Errorf("rank %d did not publish its metadata within %v (did it die, or not call rendezvous?): %w",
				ge.Rank, r.m.cfg.Timeout, ge.Err)
		}
		return fmt.Errorf("publishing metadata: %w", err)
	}
	metas := make([]meta, g.World)
	for j, v := range vals {
		if err := json.Unmarshal(v, &metas[j]); err != nil {
			return fmt.Errorf("rank %d published unreadable metadata: %w", j, err)
		}
	}
	r.metas = metas
	if err := r.m.validate(g, metas); err != nil {
		r.tellFailure(err)
		return err
	}
	r.tr.mark("listen+gather metadata")
	r.m.crashAt("gathered")
	return nil
}

// exported waits for our block's descriptor (startExport) and returns it,
// leaving the outcome in exp for handOver.
func (r *handshake) exported(exp chan exported) (int, error) {
	e := <-exp
	exp <- e // for the deferred hand-over to the block
	if e.err != nil {
		err := fmt.Errorf("exporting the block: %w", e.err)
		r.tellFailure(err)
		return 0, err
	}
	r.tr.mark("export")
	return e.fd, nil
}

// mapPeers maps every peer's block into the handle, through the provider
// (mapped) or by exchanging descriptors (fd: ours), then builds the
// handle's pointer arrays.
func (r *handshake) mapPeers(pm PeerMapper, mapped bool, fd int) (err error) {
	h := r.h
	if mapped {
		err = r.mapViews(pm)
	} else {
		err = r.exchange(fd)
	}
	r.tr.mark(fmt.Sprintf("exchange descriptors + map (of which import+map %.3fms)", float64(h.importTime.Load())/1e6))
	r.m.crashAt("mapped")
	if err == nil {
		// Before the agreement: a rank that cannot build its arrays fails
		// together with every other.
		if err = r.m.failAt("arrays"); err == nil {
			err = h.buildArrays()
		}
		r.tr.mark("pointer arrays")
	}
	return err
}

// complete publishes our outcome of mapping (mine) and gathers every
// rank's: done only when every rank has mapped every peer, so that all
// ranks succeed or all fail, and a failure is told to every rank at once:
// through the store (peers in the completion gather) and through the
// mailboxes (peers still waiting for our descriptor).
func (r *handshake) complete(mine error) error {
	g := r.g
	status := []byte{}
	if mine != nil {
		status = []byte(mine.Error())
		g.Store.Set(fmt.Sprintf("%sdone/%d", r.prefix, g.Rank), status) // best effort: the peers time out otherwise
		r.tellFailure(mine)
		return mine
	}
	vals, err := r.gatherWatching(r.prefix+"done/", status)
	if err != nil {
		var ge *store.GatherError
		switch {
		case errors.As(err, &ge):
			return fmt.Errorf("rank %d (pid %d) did not finish mapping within %v: %w", ge.Rank, r.metas[ge.Rank].PID, r.m.cfg.Timeout, ge.Err)
		case errors.Is(err, ErrPeerFailed):
			return err
		case errors.Is(err, store.ErrClosed):
			return fmt.Errorf("the store went away while gathering the ranks' completion: %w", err)
		}
		return fmt.Errorf("publishing completion: %w", err)
	}
	for j, v := range vals {
		if len(v) > 0 {
			return fmt.Errorf("%w: rank %d (pid %d) failed: %s", ErrPeerFailed, j, r.metas[j].PID, v)
		}
	}
	r.tr.mark("completion")
	return nil
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

// agree all-gathers each rank's outcome of step (nil: success), under the
// handshake's prefix, and returns mine, or the first other rank's failure,
// so that every rank succeeds or every rank fails with the same named
// cause.
func (r *handshake) agree(step string, mine error) error {
	status := []byte{}
	if mine != nil {
		status = []byte(mine.Error())
	}
	vals, err := r.gatherWatching(r.prefix+step+"/", status)
	if mine != nil {
		return mine
	}
	if err != nil {
		return fmt.Errorf("agreeing on %s: %w", step, err)
	}
	for j, v := range vals {
		if len(v) > 0 {
			return fmt.Errorf("%w: rank %d (pid %d) failed: %s", ErrPeerFailed, j, r.metas[j].PID, v)
		}
	}
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
	devs := map[string]int{}
	// Labels of one memory (host "devices") may repeat: only real devices must differ.
	_, labels := m.prov.(LabelDevices)
	for j, p := range metas {
		switch {
		case p.Host != me.Host:
			return fmt.Errorf("rank %d is on host %q, rank %d on %q: symmetric memory joins processes of one host", j, p.Host, g.Rank, me.Host)
		case p.UID != me.UID:
			return fmt.Errorf("rank %d runs as uid %d, rank %d as uid %d", j, p.UID, g.Rank, me.UID)
		case p.Provider != me.Provider:
			return fmt.Errorf("rank %d uses the %s backend, rank %d the %s backend", j, p.Provider, g.Rank, me.Provider)
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
	prefix := fmt.Sprintf("symm/%s/access%d/", g.Name, m.nextSeq(g.Name+"/access"))
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

// gatherWatching is store.AllGather of value under prefix while watching
// the peers' processes (one host: their pids came with the metadata): a
// peer that has exited ends the wait at once instead of at the deadline.
// The gather left behind ends at the deadline on its own.
func (r *handshake) gatherWatching(prefix string, value []byte) ([][]byte, error) {
	g, metas := r.g, r.metas
	type result struct {
		vals [][]byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		v, err := store.AllGather(g.Store, prefix, g.Rank, g.World, value, time.Until(r.deadline))
		done <- result{v, err}
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			return r.vals, r.err
		case <-tick.C:
			var dead []string
			for j, p := range metas {
				if j != g.Rank && !processAlive(p.PID) {
					dead = append(dead, fmt.Sprintf("rank %d (pid %d)", j, p.PID))
				}
			}
			if len(dead) > 0 {
				return nil, fmt.Errorf("%w: %s exited before finishing", ErrPeerFailed, strings.Join(dead, ", "))
			}
		}
	}
}

// processAlive reports whether pid is a live process (a zombie, exited but
// not yet reaped by its parent, counts as dead).
func processAlive(pid int) bool {
	if err := unix.Kill(pid, 0); err != nil && err != unix.EPERM {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may hold anything.
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z' && b[i+2] != 'X'
	}
	return true
}
