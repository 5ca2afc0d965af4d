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
		return fmt.Errorf("injected failure at %s (Config.FailAt)%s", phase, injectedDetail)
	}
	return nil
}

// injectedDetail ends the message of an injected failure (tests: a long
// one, to check what a failing rank's note carries).
var injectedDetail string

// beforeLink, when set (tests), runs in a rendezvous before it takes the
// group's link: a thread held there lets another overtake it.
var beforeLink func(g Group)

// crashAt kills this process with SIGKILL when Config.CrashAt names phase:
// fault injection for the tests of a peer dying in the middle of a
// rendezvous (SYMM_FAULT_CRASH_AT). The phases, in order: "publish"
// (nothing published: at a group's first rendezvous, its link not made),
// "gathered" (the group's link made, nothing of the block sent), "sent"
// (our block sent to every peer and theirs taken, before the checks and
// the completion step), "mapped" (every peer mapped, our outcome not
// sent).
func (m *Manager) crashAt(phase string) {
	if m.cfg.CrashAt == phase {
		unix.Kill(os.Getpid(), unix.SIGKILL)
		select {} // the signal is on its way
	}
}
