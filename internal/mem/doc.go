// Package mem views memory the Go heap does not own (host-backend segments,
// mapped outside Go) as byte slices, for tests and demos. The caller
// guarantees the range stays mapped while the slice is used.
package mem
