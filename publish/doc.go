// Package publish shares a process's pool statistics with monitors (symm
// top) through a small file in shared memory, one per process.
//
// A process that loads libsymm writes its page to DIR/libsymm-UID-PID-ID
// (DIR is /dev/shm unless SYMM_PUBLISH_DIR says otherwise; ID is 16 hex
// digits drawn at random), mode 0600, and removes it at exit. A background
// writer refreshes it a few times a second from the pool's statistics; the
// cached alloc/free path never touches it. Readers may read while it
// changes: the writer makes the sequence number odd, writes, and makes it
// even again (a seqlock), and a reader keeps a copy only when the number was
// even and the same before and after.
//
// Identity. /dev/shm is shared across pid namespaces (docker --ipc=host, the
// containers of one pod), so a pid alone names no process: two writers may
// have the same pid, and a reader may not see the writer's pid at all. A
// page is therefore named by its random ID, which makes its path unique (a
// writer never removes, nor an exit destructor unlinks, another's page), and
// it records the writer's pid namespace (the inode of /proc/self/ns/pid). A
// reader removes a page only when it can prove the process dead: same pid
// namespace as the reader, and the pid gone or started at another time. A
// page of another namespace is shown while it is refreshed and reported,
// never removed, once it is not.
//
// Layout (little-endian; offsets in bytes):
//
//	0    magic "SYMMPUB1"
//	8    version (u32, 2), file size (u32)
//	16   pid (u32), uid (u32)
//	24   process start time (u64, clock ticks since boot: /proc/PID/stat field 22)
//	32   sequence number (u64; odd while the writer is writing)
//	40   time of the last update (i64, Unix ns)
//	48   update interval (u32, ms), devices (u32)
//	56   statistics per device (u32), stream slots per device (u32)
//	64   backend name (16 bytes, NUL-padded)
//	80   command line (256 bytes, arguments separated by spaces, NUL-padded)
//	336  symmetric memory: blocks, handles, peer mappings (u32 each), 4 zero
//	     bytes, bytes of live blocks (u64)
//	360  offset and length of the statistic names (u32 each)
//	368  page ID (u64, the ID of the file name)
//	376  the writer's pid namespace (u64: inode of /proc/self/ns/pid; 0 if
//	     unknown)
//	384  per device: the statistics (i64 each, in the order of the names),
//	     streams in use (u32), 4 zero bytes, then the stream slots, each
//	     stream (u64), flags (u64; bit 0: a private pool), allocated,
//	     reserved and segments (i64 each)
//	...  the statistic names, NUL-separated
//
// Files: page.go (this layout, encoded and decoded), writer.go (the page's
// name and its writer), reader.go (List: the pages of this user, the problems
// with the others, and the removal of dead processes' pages).
package publish
