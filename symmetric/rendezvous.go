package symmetric

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

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
	return h, nil
}

func (m *Manager) nextSeq(group string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seq[group]++
	return m.seq[group]
}

func socketBase(pid int, group string, seq int) string {
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, group)
	if len(clean) > 40 {
		clean = clean[:40]
	}
	return fmt.Sprintf("symm-%d-%s-%d", pid, clean, seq)
}

func (m *Manager) rendezvous(b *Block, g Group) (_ *Handle, err error) {
	deadline := time.Now().Add(m.cfg.Timeout)
	tr := newTracer(m.cfg.Trace, g)
	defer tr.done()
	// Exporting takes the driver about a millisecond: do it once per block,
	// while the metadata goes round.
	type exported struct {
		fd  int
		err error
	}
	exp := make(chan exported, 1)
	pm, mapped := m.prov.(PeerMapper) // peers are mapped already: nothing to export
	if b.exportFD >= 0 || mapped {
		exp <- exported{fd: b.exportFD}
	} else {
		go func() {
			fd, err := m.prov.Export(b.mem)
			exp <- exported{fd, err}
		}()
	}
	defer func() { // the block keeps its descriptor until it is freed
		if e := <-exp; e.err == nil && b.exportFD < 0 {
			b.exportFD = e.fd
		}
	}()
	seq := m.nextSeq(g.Name)
	prefix := fmt.Sprintf("symm/%s/%d/", g.Name, seq)
	host, _ := os.Hostname()
	me := meta{PID: os.Getpid(), UID: os.Getuid(), Host: host, Provider: m.prov.Name(), Dev: b.Dev(),
		Size: b.bufSize, Block: b.mem.Size}
	if p, ok := m.prov.(Peering); ok {
		if me.DevID, err = p.DeviceID(b.Dev()); err != nil {
			return nil, fmt.Errorf("naming device %d: %w", b.Dev(), err)
		}
	}
	if mapped {
		if me.PE, err = pm.PeerID(); err != nil {
			return nil, err
		}
	}

	// Open our mailbox before publishing, so that a peer that reads our
	// metadata can send at once. Descriptors in messages still queued when
	// it closes are closed by the kernel. The name ends in a random nonce
	// (peers learn it from the metadata), so another process cannot take
	// it ahead of us; a name taken all the same is replaced by a new one.
	var mb *ipc.Mailbox
	for attempt := 0; ; attempt++ {
		me.Socket = fmt.Sprintf("%s-%d-%s", socketBase(os.Getpid(), g.Name, seq), g.Rank, mailboxNonce())
		if mb, err = ipc.OpenMailbox(me.Socket); err == nil || !errors.Is(err, unix.EADDRINUSE) || attempt == 2 {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	defer mb.Close()
	m.crashAt("publish")
	raw, _ := json.Marshal(me)
	vals, err := store.AllGather(g.Store, prefix+"meta/", g.Rank, g.World, raw, time.Until(deadline))
	if err != nil {
		var ge *store.GatherError
		switch {
		case errors.Is(err, store.ErrClosed):
			return nil, fmt.Errorf("the store went away while gathering the ranks' metadata: %w", err)
		case errors.As(err, &ge):
			return nil, fmt.Errorf("rank %d did not publish its metadata within %v (did it die, or not call rendezvous?): %w",
				ge.Rank, m.cfg.Timeout, ge.Err)
		}
		return nil, fmt.Errorf("publishing metadata: %w", err)
	}
	metas := make([]meta, g.World)
	for j, v := range vals {
		if err := json.Unmarshal(v, &metas[j]); err != nil {
			return nil, fmt.Errorf("rank %d published unreadable metadata: %w", j, err)
		}
	}
	// From here on a rank that fails tells its peers through their
	// mailboxes, so that none waits for its descriptor until the timeout
	// (ranks that see different devices may judge a group differently).
	if err := m.validate(g, metas); err != nil {
		tellFailure(mb, g, metas, err, deadline)
		return nil, err
	}
	tr.mark("listen+gather metadata")
	m.crashAt("gathered")

	e := <-exp
	exp <- e // for the deferred hand-over to the block
	if e.err != nil {
		err := fmt.Errorf("exporting the block: %w", e.err)
		tellFailure(mb, g, metas, err, deadline)
		return nil, err
	}
	tr.mark("export")

	h := &Handle{m: m, b: b, group: g.Name, rank: g.Rank, world: g.World, peers: make([]*Mem, g.World)}
	defer func() {
		if err != nil { // nothing stays mapped after a failed rendezvous
			h.release()
		}
	}()
	if mapped {
		err = h.mapViews(pm, metas)
	} else {
		err = h.exchange(mb, metas, e.fd, g, deadline)
	}
	tr.mark(fmt.Sprintf("exchange descriptors + map (of which import+map %.3fms)", float64(h.importTime.Load())/1e6))
	m.crashAt("mapped")
	if err == nil {
		// Before the agreement below: a rank that cannot build its arrays
		// fails together with every other.
		if err = m.failAt("arrays"); err == nil {
			err = h.buildArrays()
		}
		tr.mark("pointer arrays")
	}

	// Done only when every rank has mapped every peer, so that all ranks
	// succeed or all fail, and a failure is told to every rank at once:
	// through the store (peers in the completion gather) and through the
	// mailboxes (peers still waiting for our descriptor).
	status := []byte{}
	if err != nil {
		status = []byte(err.Error())
		g.Store.Set(fmt.Sprintf("%sdone/%d", prefix, g.Rank), status) // best effort: the peers time out otherwise
		tellFailure(mb, g, metas, err, deadline)
		return nil, err
	}
	vals, err = gatherWatching(g, prefix+"done/", status, deadline, metas)
	if err != nil {
		var ge *store.GatherError
		switch {
		case errors.As(err, &ge):
			return nil, fmt.Errorf("rank %d (pid %d) did not finish mapping within %v: %w", ge.Rank, metas[ge.Rank].PID, m.cfg.Timeout, ge.Err)
		case errors.Is(err, ErrPeerFailed):
			return nil, err
		case errors.Is(err, store.ErrClosed):
			return nil, fmt.Errorf("the store went away while gathering the ranks' completion: %w", err)
		}
		return nil, fmt.Errorf("publishing completion: %w", err)
	}
	for j, v := range vals {
		if len(v) > 0 {
			return nil, fmt.Errorf("%w: rank %d (pid %d) failed: %s", ErrPeerFailed, j, metas[j].PID, v)
		}
	}
	tr.mark("completion")
	if r, ok := m.prov.(Registrar); ok { // every rank got here: the collective cannot hang on a failed one
		if err = m.failAt("register"); err == nil {
			h.unregister, err = r.Register(b.mem, g.Rank, g.World)
		}
		if err != nil {
			err = fmt.Errorf("registering the block with %s: %w", m.prov.Name(), err)
		}
		// A second agreement: the registration can fail on one rank after
		// all agreed above; then every rank fails, naming it.
		if err = m.agree(g, prefix+"registered/", err, deadline, metas); err != nil {
			return nil, err
		}
		tr.mark("registration")
	}
	return h, nil
}

// agree all-gathers each rank's outcome of a step (nil: success) and
// returns mine, or the first other rank's failure, so that every rank
// succeeds or every rank fails with the same named cause.
func (m *Manager) agree(g Group, prefix string, mine error, deadline time.Time, metas []meta) error {
	status := []byte{}
	if mine != nil {
		status = []byte(mine.Error())
	}
	vals, err := gatherWatching(g, prefix, status, deadline, metas)
	if mine != nil {
		return mine
	}
	if err != nil {
		return fmt.Errorf("agreeing on %s: %w", strings.TrimSuffix(prefix[strings.LastIndex(strings.TrimSuffix(prefix, "/"), "/")+1:], "/"), err)
	}
	for j, v := range vals {
		if len(v) > 0 {
			return fmt.Errorf("%w: rank %d (pid %d) failed: %s", ErrPeerFailed, j, metas[j].PID, v)
		}
	}
	return nil
}

// failAt returns the injected failure of phase (Config.FailAt), or nil.
func (m *Manager) failAt(phase string) error {
	if m.cfg.FailAt == phase {
		return fmt.Errorf("injected failure at %s (Config.FailAt)", phase)
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

// exchange sends our block's descriptor fd to every peer's mailbox while
// taking and mapping theirs from mb.
func (h *Handle) exchange(mb *ipc.Mailbox, metas []meta, fd int, g Group, deadline time.Time) error {
	// Send while receiving: a peer's queue may be full until it reads.
	sent := make(chan error, 1)
	gone := make(chan error, g.World) // peers found dead while sending
	go func() {
		var errs []error
		payload := []byte(fmt.Sprint(g.Rank))
		if err := h.m.failAt("send"); err != nil {
			sent <- err
			return
		}
		for j := 0; j < g.World; j++ {
			if j != g.Rank {
				if err := mb.SendTo(metas[j].Socket, payload, []int{fd}, time.Until(deadline)); err != nil {
					if errors.Is(err, ipc.ErrNoMailbox) { // its process has exited
						err = fmt.Errorf("%w: rank %d (pid %d) is gone: %w", ErrPeerFailed, j, metas[j].PID, err)
						gone <- err
					} else {
						err = fmt.Errorf("sending our block to rank %d (pid %d): %w", j, metas[j].PID, err)
					}
					errs = append(errs, err)
				}
			}
		}
		sent <- errors.Join(errs...)
		h.m.crashAt("sent")
	}()
	rerr := h.receive(mb, metas, deadline, gone)
	serr := <-sent
	if serr != nil && errors.Is(serr, ipc.ErrNoMailbox) {
		if rerr != nil {
			return rerr // the same failure, said once
		}
		// A peer whose mailbox is gone either died or failed after telling
		// us why (its message was sent before its mailbox closed): prefer
		// the cause to "gone".
		if cause := h.pendingFailure(mb, metas, 100*time.Millisecond); cause != nil {
			return cause
		}
	}
	return errors.Join(rerr, serr)
}

// failureIn returns the failure a peer reported in msg (tellFailure), or nil
// if msg is not one, or not from the process that published that rank.
func (h *Handle) failureIn(msg ipc.Message, metas []meta) error {
	if !strings.HasPrefix(string(msg.Payload), failurePrefix) {
		return nil
	}
	rank, text, _ := strings.Cut(strings.TrimPrefix(string(msg.Payload), failurePrefix), ":")
	if j, err := strconv.Atoi(rank); err == nil && j >= 0 && j < h.world && msg.PID == metas[j].PID && msg.UID == os.Getuid() {
		return fmt.Errorf("%w: rank %d (pid %d) failed: %s", ErrPeerFailed, j, msg.PID, text)
	}
	return nil
}

// pendingFailure reads what is left in mb for up to wait and returns the
// first failure a peer reported there, or nil. Descriptors in other
// messages are closed: the rendezvous is failing anyway.
func (h *Handle) pendingFailure(mb *ipc.Mailbox, metas []meta, wait time.Duration) error {
	until := time.Now().Add(wait)
	for time.Now().Before(until) {
		msg, err := mb.Recv(1, time.Until(until))
		if err != nil && !errors.Is(err, ipc.ErrBadMessage) {
			return nil
		}
		for _, fd := range msg.FDs {
			unix.Close(fd)
		}
		if err == nil {
			if cause := h.failureIn(msg, metas); cause != nil {
				return cause
			}
		}
	}
	return nil
}

// mapViews finds every peer's block through the provider (NVSHMEM's
// nvshmem_ptr on our symmetric address): no descriptor changes hands.
func (h *Handle) mapViews(pm PeerMapper, metas []meta) error {
	for j, p := range metas {
		if j == h.rank {
			continue
		}
		ptr, err := pm.PeerPtr(h.b.mem, p.PE)
		if err != nil {
			return fmt.Errorf("rank %d (pid %d, PE %d): %w", j, p.PID, p.PE, err)
		}
		h.peers[j] = &Mem{Ptr: ptr, Size: h.b.mem.Size, Dev: h.b.Dev(), fd: -1, view: true}
	}
	return nil
}

// failurePrefix starts a mailbox message that reports a rank's failure
// instead of carrying its descriptor.
const failurePrefix = "!"

// tellFailure sends err to every peer's mailbox (best effort).
func tellFailure(mb *ipc.Mailbox, g Group, metas []meta, err error, deadline time.Time) {
	msg := []byte(fmt.Sprintf("%s%d:%v", failurePrefix, g.Rank, err))
	if len(msg) > 60<<10 {
		msg = msg[:60<<10]
	}
	for j := 0; j < g.World; j++ {
		if j != g.Rank {
			mb.SendTo(metas[j].Socket, msg, nil, min(time.Until(deadline), time.Second))
		}
	}
}

// receive takes one descriptor from each peer in mb and maps it, until
// deadline. A message is taken only from the process that published rank
// j's metadata and runs as our uid; anything else is closed and ignored.
// Peers are mapped as their messages come, in parallel.
func (h *Handle) receive(mb *ipc.Mailbox, metas []meta, deadline time.Time, gone <-chan error) error {
	var wg sync.WaitGroup
	errs := make([]error, h.world)
	got := make([]bool, h.world)
	missing, ignored := h.world-1, 0
	var lastErr error
	for missing > 0 {
		// Wait in short slices, so that a peer found dead by the sender
		// (its mailbox is gone) ends the wait at once.
		msg, err := mb.Recv(1, min(time.Until(deadline), 50*time.Millisecond))
		if errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(deadline) {
			select {
			case e := <-gone:
				wg.Wait()
				return errors.Join(append(errs, e)...)
			default:
			}
			for j := range got {
				if !got[j] && j != h.rank && !processAlive(metas[j].PID) {
					wg.Wait()
					return errors.Join(append(errs, fmt.Errorf("%w: rank %d (pid %d) exited before sending its block", ErrPeerFailed, j, metas[j].PID))...)
				}
			}
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			var who []string
			for j := range got {
				if !got[j] && j != h.rank {
					who = append(who, fmt.Sprintf("rank %d (pid %d)", j, metas[j].PID))
				}
			}
			more := ""
			if ignored > 0 {
				more = fmt.Sprintf("; %d stray messages ignored, the last: %v", ignored, lastErr)
			}
			wg.Wait()
			return errors.Join(append(errs, fmt.Errorf("no block came from %s by the deadline (did it die?)%s: %w",
				strings.Join(who, ", "), more, err))...)
		}
		if err != nil && !errors.Is(err, ipc.ErrBadMessage) {
			wg.Wait()
			return err
		}
		if err == nil {
			if cause := h.failureIn(msg, metas); cause != nil {
				wg.Wait()
				return cause
			}
		}
		j, perr := strconv.Atoi(string(msg.Payload))
		switch {
		case err != nil:
			lastErr = err // a malformed message: its descriptors are closed
		case perr != nil || j < 0 || j >= h.world || j == h.rank || got[j]:
			lastErr = fmt.Errorf("message %q from pid %d is not a peer's first", msg.Payload, msg.PID)
		case msg.PID != metas[j].PID || msg.UID != os.Getuid():
			lastErr = fmt.Errorf("pid %d uid %d claimed to be rank %d (pid %d)", msg.PID, msg.UID, j, metas[j].PID)
		default:
			got[j] = true
			missing--
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[j] = h.mapPeer(j, msg.FDs, metas[j])
			}()
			continue
		}
		ignored++
		strayMessages.Add(1)
		for _, fd := range msg.FDs {
			unix.Close(fd)
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// mapPeer imports the one descriptor rank j sent and closes it.
func (h *Handle) mapPeer(j int, fds []int, peer meta) error {
	if len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return fmt.Errorf("rank %d sent %d descriptors, expected 1", j, len(fds))
	}
	start := time.Now()
	defer func() { h.importTime.Add(int64(time.Since(start))) }()
	defer unix.Close(fds[0])
	mem, err := h.m.prov.Import(h.b.Dev(), fds[0], peer.Block)
	if err != nil {
		return fmt.Errorf("mapping rank %d's block: %w", j, err)
	}
	h.peers[j] = mem
	return nil
}

// validate checks that the ranks' blocks can be joined, naming the rank that
// differs from rank 0 or from us.
func (m *Manager) validate(g Group, metas []meta) error {
	me := metas[g.Rank]
	devs := map[string]int{}
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
		// Host "devices" are labels of one memory: only real devices must differ.
		if m.prov.Name() != "host" && !m.cfg.AllowOverlappingDevices {
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

// Handle is one block joined with one group.
type Handle struct {
	m     *Manager
	b     *Block
	group string
	rank  int
	world int
	peers []*Mem // peers[j] maps rank j's block; nil for our own

	// arrays: world buffer pointers then world signal-pad pointers, in host
	// memory outside Go's heap (C callers keep these pointers) and, for
	// devices, in device memory.
	hostArr, devArr uintptr
	hostSize        uint64
	freeDev         func() error

	importTime atomic.Int64 // ns spent importing and mapping peers (trace)
	unregister func() error // undoes Registrar.Register (NCCL window)

	// asyncErr is the first signal the watchdog saw time out (watchdog.go):
	// once set, every signal call on the handle fails with it.
	asyncErr atomic.Pointer[error]

	kstat kernelStatus // where its kernels report timeouts (kernelsig.go)
}

// Acquire keeps the handle's block from being freed until release is
// called, and fails (ErrUnknownPointer) if it was freed already. Every call
// that touches the handle's mappings or arrays holds it; a free waits for
// such calls to return.
func (h *Handle) Acquire() (release func(), err error) {
	h.b.life.RLock()
	if h.b.freedLocked() {
		h.b.life.RUnlock()
		return nil, fmt.Errorf("%w: a handle of group %q whose block %#x was freed", ErrUnknownPointer, h.group, h.b.Ptr())
	}
	if testHookAcquired != nil {
		testHookAcquired()
	}
	return h.b.runlock, nil
}

// testHookAcquired, set only by tests, runs inside Acquire's hold: it widens
// the window in which a free racing the call would unmap what it uses.
var testHookAcquired func()

func (h *Handle) Rank() int          { return h.rank }
func (h *Handle) World() int         { return h.world }
func (h *Handle) BufferSize() uint64 { return h.b.bufSize }
func (h *Handle) Block() *Block      { return h.b }

// BufferPtr is rank r's buffer as mapped here; PadPtr its signal pad.
func (h *Handle) BufferPtr(r int) uintptr {
	if r == h.rank {
		return h.b.Ptr()
	}
	return h.peers[r].Ptr
}
func (h *Handle) PadPtr(r int) uintptr { return h.BufferPtr(r) + uintptr(h.b.padOff) }

// BufferPtrsHost and PadPtrsHost are arrays of world pointers in host memory.
func (h *Handle) BufferPtrsHost() uintptr { return h.hostArr }
func (h *Handle) PadPtrsHost() uintptr    { return h.hostArr + uintptr(8*h.world) }

// BufferPtrsDev and PadPtrsDev are the same arrays in device memory.
func (h *Handle) BufferPtrsDev() uintptr { return h.devArr }
func (h *Handle) PadPtrsDev() uintptr    { return h.devArr + uintptr(8*h.world) }

// DeviceArrays is implemented by providers whose devices cannot read host
// memory: it copies vals to new device memory.
type DeviceArrays interface {
	DeviceArray(dev int, vals []uint64) (ptr uintptr, free func() error, err error)
}

func (h *Handle) buildArrays() error {
	vals := make([]uint64, 2*h.world)
	for r := 0; r < h.world; r++ {
		vals[r] = uint64(h.BufferPtr(r))
		vals[h.world+r] = uint64(h.PadPtr(r))
	}
	size := uint64(len(vals) * 8)
	p, _, e := unix.Syscall6(unix.SYS_MMAP, 0, uintptr(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uintptr(0), 0)
	if e != 0 {
		return fmt.Errorf("mapping the pointer arrays: %w", e)
	}
	h.hostArr, h.hostSize = p, size
	copy(unsafe.Slice((*uint64)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), len(vals)), vals)
	h.devArr = h.hostArr
	if da, ok := h.m.prov.(DeviceArrays); ok {
		ptr, free, err := da.DeviceArray(h.b.Dev(), vals)
		if err != nil {
			return fmt.Errorf("device pointer arrays: %w", err)
		}
		h.devArr, h.freeDev = ptr, free
	}
	return nil
}

// release unmaps every peer and frees the arrays. Called with b.mu held.
func (h *Handle) release() error {
	var errs []error
	if h.unregister != nil {
		errs = append(errs, h.unregister())
		h.unregister = nil
	}
	for j, p := range h.peers {
		if p != nil {
			errs = append(errs, h.m.prov.Release(p))
			h.peers[j] = nil
		}
	}
	errs = append(errs, h.freeStatus())
	if h.freeDev != nil {
		errs = append(errs, h.freeDev())
		h.freeDev = nil
	}
	if h.hostArr != 0 {
		if _, _, e := unix.Syscall(unix.SYS_MUNMAP, h.hostArr, uintptr(h.hostSize), 0); e != 0 {
			errs = append(errs, e)
		}
		h.hostArr, h.devArr = 0, 0
	}
	return errors.Join(errs...)
}

// hostBound turns "no timeout" into the manager's timeout on the host
// backend: there a signal is waited for by the calling thread, not queued on
// a stream, so waiting for ever would hang the caller.
func (h *Handle) hostBound(timeout time.Duration) time.Duration {
	if timeout <= 0 && h.m.prov.Name() == "host" {
		return h.m.cfg.Timeout
	}
	return timeout
}

// slotAddr is the address of slot (channel, src) in rank dst's pad.
func (h *Handle) slotAddr(dst, src, channel int) (uintptr, error) {
	switch {
	case dst < 0 || dst >= h.world:
		return 0, fmt.Errorf("%w: destination rank %d outside [0, %d)", ErrInvalid, dst, h.world)
	case src < 0 || src >= h.world:
		return 0, fmt.Errorf("%w: source rank %d outside [0, %d)", ErrInvalid, src, h.world)
	}
	i := channel*h.world + src
	if channel < 0 || (i+1)*4 > SignalPadSize {
		return 0, fmt.Errorf("%w: channel %d outside [0, %d) for world size %d", ErrInvalid, channel, SignalPadSize/4/h.world, h.world)
	}
	return h.PadPtr(dst) + uintptr(4*i), nil
}

// PutSignal sets our slot of channel in rank dst's pad, in stream order,
// once dst has consumed our previous signal on it (the slot is 0 again), so
// that back-to-back signals are never merged into one.
func (h *Handle) PutSignal(dst, channel int, stream uintptr, timeout time.Duration) error {
	release, err := h.Acquire()
	if err != nil {
		return err
	}
	defer release()
	if k, err := h.kernelCall(dst, channel); err != nil || k {
		if err != nil {
			return err
		}
		return h.kernelPut(dst, channel, stream, timeout)
	}
	if err := h.putSignal(dst, channel, stream, timeout); err != nil {
		return err
	}
	if timeout <= 0 {
		return h.watchAsync(stream, fmt.Sprintf("put_signal to rank %d on channel %d of group %q (rank %d)", dst, channel, h.group, h.rank))
	}
	return nil
}

func (h *Handle) putSignal(dst, channel int, stream uintptr, timeout time.Duration) error {
	if err := h.failed(); err != nil {
		return err
	}
	timeout = h.hostBound(timeout)
	a, err := h.slotAddr(dst, h.rank, channel)
	if err != nil {
		return err
	}
	if err := h.m.prov.PutSignal(h.b.Dev(), stream, a, timeout); err != nil {
		return fmt.Errorf("put_signal to rank %d on channel %d of group %q (rank %d): rank %d has not taken our previous signal: %w",
			dst, channel, h.group, h.rank, dst, err)
	}
	return nil
}

// WaitSignal waits for rank src's signal on channel and resets the slot.
func (h *Handle) WaitSignal(src, channel int, stream uintptr, timeout time.Duration) error {
	release, err := h.Acquire()
	if err != nil {
		return err
	}
	defer release()
	if k, err := h.kernelCall(src, channel); err != nil || k {
		if err != nil {
			return err
		}
		return h.kernelWait(src, channel, stream, timeout)
	}
	if err := h.waitSignal(src, channel, stream, timeout); err != nil {
		return err
	}
	if timeout <= 0 {
		return h.watchAsync(stream, fmt.Sprintf("wait_signal from rank %d on channel %d of group %q (rank %d)", src, channel, h.group, h.rank))
	}
	return nil
}

func (h *Handle) waitSignal(src, channel int, stream uintptr, timeout time.Duration) error {
	if err := h.failed(); err != nil {
		return err
	}
	timeout = h.hostBound(timeout)
	a, err := h.slotAddr(h.rank, src, channel)
	if err != nil {
		return err
	}
	if err := h.m.prov.WaitSignal(h.b.Dev(), stream, a, timeout); err != nil {
		return fmt.Errorf("wait_signal from rank %d on channel %d of group %q (rank %d): %w", src, channel, h.group, h.rank, err)
	}
	return nil
}

// Barrier signals every peer on channel and waits for every peer's signal.
func (h *Handle) Barrier(channel int, stream uintptr, timeout time.Duration) error {
	release, err := h.Acquire()
	if err != nil {
		return err
	}
	defer release()
	if err := h.failed(); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	if k, err := h.kernelCall(h.rank, channel); err != nil || k {
		if err != nil || h.world == 1 {
			return err
		}
		return h.kernelBarrier(channel, stream, timeout)
	}
	if err := h.signalPeers(channel, stream, timeout); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	if timeout <= 0 && h.world > 1 {
		peers := make([]int, 0, h.world-1)
		for r := 0; r < h.world; r++ {
			if r != h.rank {
				peers = append(peers, r)
			}
		}
		return h.watchAsync(stream, fmt.Sprintf("barrier on channel %d of group %q (rank %d): a signal from or to rank(s) %v",
			channel, h.group, h.rank, peers))
	}
	return nil
}

// signalPeers signals every peer on channel, then waits for each (a barrier
// without kernels; the host all-reduce's synchronization).
func (h *Handle) signalPeers(channel int, stream uintptr, timeout time.Duration) error {
	for r := 0; r < h.world; r++ {
		if r != h.rank {
			if err := h.putSignal(r, channel, stream, timeout); err != nil {
				return err
			}
		}
	}
	for r := 0; r < h.world; r++ {
		if r != h.rank {
			if err := h.waitSignal(r, channel, stream, timeout); err != nil {
				return err
			}
		}
	}
	return nil
}

// kernelCall checks a signal call's peer and channel and the handle's
// state, and says whether the call runs as a kernel (kernelsig.go).
func (h *Handle) kernelCall(peer, channel int) (bool, error) {
	k, err := h.useKernels()
	if err != nil || !k {
		return false, err
	}
	if err := h.failed(); err != nil {
		return false, err
	}
	if _, err := h.slotAddr(peer, h.rank, channel); err != nil {
		return false, err
	}
	return true, nil
}

// HasMulticastSupport is always false: libsymm never creates multicast objects.
func HasMulticastSupport() bool { return false }

// WorldWithinDirectAccess reports whether every rank of g, each on its
// device dev, can map every other rank's device memory (P2P over NVLink or
// PCIe), so that a rendezvous of the group can succeed. Every rank of g must
// call it; all get the same answer (each rank judges the pairs it can see,
// then the verdicts are gathered). The host backend always answers true.
func (m *Manager) WorldWithinDirectAccess(dev int, g Group) (bool, error) {
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

// crashAt kills this process with SIGKILL when Config.CrashAt names phase:
// fault injection for the tests of a peer dying in the middle of a
// rendezvous (SYMM_FAULT_CRASH_AT). The phases, in order: "publish" (mailbox
// open, metadata not yet published), "gathered" (every rank's metadata
// read, nothing sent), "sent" (our descriptor sent to every peer, before
// the completion step), "mapped" (every peer mapped, completion not
// published).
func (m *Manager) crashAt(phase string) {
	if m.cfg.CrashAt == phase {
		unix.Kill(os.Getpid(), unix.SIGKILL)
		select {} // the signal is on its way
	}
}

// gatherWatching is store.AllGather while watching the peers' processes
// (one host: their pids came with the metadata): a peer that has exited
// ends the wait at once instead of at the deadline. The gather left behind
// ends at the deadline on its own.
func gatherWatching(g Group, prefix string, value []byte, deadline time.Time, metas []meta) ([][]byte, error) {
	type result struct {
		vals [][]byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		v, err := store.AllGather(g.Store, prefix, g.Rank, g.World, value, time.Until(deadline))
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

// mailboxNonce makes the random end of a mailbox name (a variable: tests
// make it predictable).
var mailboxNonce = func() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Sprint(time.Now().UnixNano())
	}
	return hex.EncodeToString(b[:])
}

// strayMessages counts mailbox messages refused over the process's life
// (not from the expected peer process, malformed, or duplicates).
var strayMessages atomic.Int64
