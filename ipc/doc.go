// Package ipc passes file descriptors between the processes of one host over
// Unix-domain sockets, checking who is at the other end. Symmetric memory
// uses it to hand each peer the descriptor of its block (a memfd, or a CUDA
// VMM handle exported as a POSIX file descriptor).
//
// # Contract
//
//   - Sockets are SOCK_SEQPACKET in Linux's abstract namespace ("\x00"+name):
//     no file on disk, and the name is gone when its process dies, so a
//     crashed rank leaves nothing to clean up. Names are 1 to 100 bytes.
//   - Both ends check the other with SO_PEERCRED: a Listener's Accept takes
//     only the expected pid with our uid (anything else is closed, counted in
//     Rejected, and Accept keeps waiting); Dial fails unless the listener is
//     the expected pid with our uid. A message is one packet: a payload of
//     at most 64 KiB and up to 253 descriptors (SCM_RIGHTS), delivered whole.
//   - A connection's identity is checked once, when it is made: a pid
//     (SO_PEERCRED) is fixed when the peer connected or listened, and a
//     later holder of the name cannot reach into a connection made before.
//     ProcessStart and PIDNamespace let a caller check a pid against the
//     process it agreed on (pids are reused; start times are not).
//   - Every call that waits has a real deadline (through Go's runtime poller):
//     a timeout ends it with an error that wraps os.ErrDeadlineExceeded, and
//     Close ends it at once. timeout <= 0 means: do not wait. Send gives up
//     after 30 s if the peer never makes room; SendWithin after its timeout.
//   - Every descriptor is close-on-exec, received ones included
//     (MSG_CMSG_CLOEXEC). Received descriptors belong to the caller; when
//     Recv fails after descriptors arrived (too many, truncated data or
//     control data, a message not ours), it closes every one of them first.
//   - Errors say what and who: the socket name, the pid expected or found,
//     how long was waited, how many others were rejected.
//
// Abstract names belong to a network namespace and pids are those seen from
// ours: processes in different network or pid namespaces (some container
// setups) cannot meet this way, and fail with a clear error rather than
// connect to the wrong peer.
//
// Linux only; pure Go (golang.org/x/sys/unix).
//
// Files: ipc.go (listeners, connections, descriptor passing), identity.go (a
// process's start time and pid namespace, to check a pid against the process
// agreed on).
package ipc
