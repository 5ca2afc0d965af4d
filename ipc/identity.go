package ipc

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// A process is named by its pid and its start time (clock ticks after boot,
// /proc/PID/stat's 22nd field): a pid may be reused once its process has
// exited, the pair is not, so a peer checked by both is the process that
// was agreed on, not a later one that took its pid.

// ProcessStart returns pid's start time as /proc (of our pid namespace)
// shows it, or an error if no such process is visible.
func ProcessStart(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("ipc: the start time of pid %d: %w", pid, err)
	}
	// The command name, in parentheses, may hold anything: count the fields
	// after its last ')'. State is field 3, start time field 22.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("ipc: the start time of pid %d: unreadable /proc/%d/stat", pid, pid)
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 20 {
		return 0, fmt.Errorf("ipc: the start time of pid %d: /proc/%d/stat has %d fields after the name", pid, pid, len(fields))
	}
	start, err := strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("ipc: the start time of pid %d: %w", pid, err)
	}
	return start, nil
}

// PIDNamespace names this process's pid namespace ("pid:[4026531836]"), or
// returns "" where /proc does not say. Pids (and SO_PEERCRED's) are those
// of the reader's namespace: two processes compare pids only within one.
func PIDNamespace() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	return ns
}
