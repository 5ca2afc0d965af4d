package symmetric

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Fault injection for the tests of a rendezvous that fails on one rank
// (Config.FailAt) or loses a rank that dies in the middle (Config.CrashAt,
// SYMM_FAULT_CRASH_AT). Both are off unless a test sets them.

// failAt returns the injected failure of phase (Config.FailAt: "send",
// "arrays" or "register"), or nil.
func (m *Manager) failAt(phase string) error {
	if m.cfg.FailAt == phase {
		return fmt.Errorf("injected failure at %s (Config.FailAt)", phase)
	}
	return nil
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
