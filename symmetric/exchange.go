package symmetric

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Peers' blocks, mapped during a rendezvous (rendezvous.go) in one of two
// ways: by descriptors that change hands on the group's link (a checked
// Unix seqpacket connection to each peer, SCM_RIGHTS: link.go), sent only
// to the process that published a rank's metadata and taken only from it;
// or, for providers that map peers themselves (PeerMapper: NVSHMEM), as
// views the provider hands out. The link also carries a failing rank's
// cause to its peers, so that none waits for its descriptor until the
// timeout.

// socketBase starts the names of the listeners of one link of this
// process: the group's name cut to 40 safe characters, within the length of
// a socket's name.
func socketBase(pid int, group string, seq int64) string {
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

// exchange sends our metadata and descriptor fd (none when mapped) to
// every peer and maps each peer's block into r.h as its note comes, in
// parallel, then checks every rank's metadata (validate): every rank reads
// the same notes, so all judge alike. Every mapping has ended when it
// returns.
func (r *handshake) exchange(pm PeerMapper, mapped bool, me meta, fd int) error {
	h := r.h
	if err := r.m.failAt("send"); err != nil {
		return err
	}
	var fds []int
	if !mapped {
		fds = []int{fd}
	}
	var wg sync.WaitGroup
	errs := make([]error, r.g.World)
	notes, err := r.gather("block", note{Meta: &me}, fds, func(j int, n note) {
		switch {
		case n.Meta == nil:
			errs[j] = fmt.Errorf("%s sent no metadata", r.who(j))
		case mapped:
			errs[j] = nil
		case n.Meta.Block != me.Block:
			errs[j] = nil // validate names the difference
		default:
			fds := n.fds
			n.fds = nil
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[j] = h.mapPeer(j, fds, *n.Meta)
			}()
		}
		n.closeFDs()
	})
	wg.Wait()
	r.m.crashAt("sent")
	if err != nil {
		return err
	}
	r.metas = make([]meta, r.g.World)
	for j, n := range notes {
		if n.Meta == nil {
			return errors.Join(errs...)
		}
		r.metas[j] = *n.Meta
	}
	h.metas = r.metas
	if err := r.m.validate(r.g, r.metas); err != nil {
		return err
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if mapped {
		return r.mapViews(pm)
	}
	return nil
}

// mapViews finds every peer's block through the provider (NVSHMEM's
// nvshmem_ptr on our symmetric address) and puts it in r.h: no descriptor
// changes hands.
func (r *handshake) mapViews(pm PeerMapper) error {
	h := r.h
	for j, p := range r.metas {
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

// listenerNonce makes the random end of a link's listener name (a variable: tests
// make it predictable).
var listenerNonce = func() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Sprint(time.Now().UnixNano())
	}
	return hex.EncodeToString(b[:])
}

// strayMessages counts link messages refused over the process's life
// (malformed, from another rank than their connection's, duplicates, or
// left over from a handshake that had ended).
var strayMessages atomic.Int64
