package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// Wire format. A connection carries frames both ways; every frame is
//
//	length  uint32       bytes that follow: headerLen <= length <= the reader's limit
//	op      uint8        opAuth, opSet, opGet, opAdd, opDelete; opReply in replies
//	status  uint8        replies: statusOK or an error class; requests: 0
//	id      uint64       chosen by the client, echoed by the reply (0: auth, and
//	                     replies about the connection as a whole)
//	num     int64        Get: timeout in ns; Add: delta; Auth: protocol version;
//	                     reply to Add: the new value
//	keyLen  uint16       <= maxKeyLen; 0 for Auth and replies
//	key     [keyLen]byte UTF-8
//	value   the rest     Set: value; Auth: token; reply to Get: value;
//	                     error reply: the message
//
// with integers big-endian. Every field has one encoding, so a frame that
// decodes re-encodes to the same bytes (FuzzDecodeFrame checks it).
//
// The first frame of a connection is Auth; the server answers it and then
// one reply per request, in any order (a waiting Get answers late). A frame
// that does not decode gets a reply with id 0 and statusBadFrame, and the
// connection is closed.
const (
	opAuth   byte = 1
	opSet    byte = 2
	opGet    byte = 3
	opAdd    byte = 4
	opDelete byte = 5
	opReply  byte = 0x80

	statusOK       byte = 0
	statusTimeout  byte = 1 // wraps ErrTimeout
	statusClosed   byte = 2 // wraps ErrClosed
	statusInvalid  byte = 3 // the request was refused (bad key, not an integer, ...)
	statusAuth     byte = 4 // authentication failed; the connection is closed
	statusBadFrame byte = 5 // the frame did not decode; the connection is closed
	statusBusy     byte = 6 // too many Gets waiting on this connection
	maxStatus           = statusBusy

	protocolVersion = 1

	headerLen   = 1 + 1 + 8 + 8 + 2
	maxTokenLen = 4 << 10
	// maxFrame bounds every frame after authentication; maxAuthFrame bounds
	// frames before it, so a stranger cannot make the server buffer 64 MiB.
	maxFrame     = headerLen + maxKeyLen + maxValueLen
	maxAuthFrame = headerLen + maxTokenLen
)

type frame struct {
	op     byte
	status byte
	id     uint64
	num    int64
	key    string
	value  []byte
}

var opNames = map[byte]string{opAuth: "auth", opSet: "set", opGet: "get", opAdd: "add", opDelete: "delete", opReply: "reply"}

// appendFrame appends f, length first, to dst. The caller keeps f within the
// limits; decodeFrame is the check.
func appendFrame(dst []byte, f frame) []byte {
	n := headerLen + len(f.key) + len(f.value)
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	dst = append(dst, f.op, f.status)
	dst = binary.BigEndian.AppendUint64(dst, f.id)
	dst = binary.BigEndian.AppendUint64(dst, uint64(f.num))
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(f.key)))
	dst = append(dst, f.key...)
	return append(dst, f.value...)
}

// frameError is a frame that breaks the format: the connection that sent it
// cannot be trusted to be in step any more.
type frameError struct{ msg string }

func (e *frameError) Error() string { return "bad frame: " + e.msg }

func badFrame(format string, args ...any) error { return &frameError{fmt.Sprintf(format, args...)} }

// readFrameLen reads a frame's length and checks it against limit.
func readFrameLen(r io.Reader, limit int) (int, error) {
	var b [4]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	n := binary.BigEndian.Uint32(b[:])
	if n < headerLen {
		return 0, badFrame("length %d is shorter than the %d-byte header", n, headerLen)
	}
	if uint64(n) > uint64(limit) {
		return 0, badFrame("length %d exceeds the %d-byte limit", n, limit)
	}
	return int(n), nil
}

// readFrameBody reads the n bytes of a frame. Memory grows with the bytes
// that arrive, not with the length claimed, so a peer that announces a big
// frame and stalls costs little.
func readFrameBody(r io.Reader, n int) ([]byte, error) {
	const eager = 64 << 10
	if n <= eager {
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return b, noEOF(err)
	}
	var buf bytes.Buffer
	buf.Grow(eager)
	_, err := io.CopyN(&buf, r, int64(n))
	return buf.Bytes(), noEOF(err)
}

// noEOF turns the end of the stream inside a frame into an error that says so.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("connection closed inside a frame: %w", io.ErrUnexpectedEOF)
	}
	return err
}

// decodeFrame decodes a frame's body (without its length). The frame's key
// and value alias b.
func decodeFrame(b []byte) (frame, error) {
	if len(b) < headerLen {
		return frame{}, badFrame("%d bytes are shorter than the %d-byte header", len(b), headerLen)
	}
	f := frame{
		op:     b[0],
		status: b[1],
		id:     binary.BigEndian.Uint64(b[2:]),
		num:    int64(binary.BigEndian.Uint64(b[10:])),
	}
	keyLen := int(binary.BigEndian.Uint16(b[18:]))
	rest := b[headerLen:]
	name, ok := opNames[f.op]
	if !ok {
		return frame{}, badFrame("unknown op %#x", f.op)
	}
	if f.op == opReply {
		if f.status > maxStatus {
			return frame{}, badFrame("unknown status %d", f.status)
		}
	} else if f.status != 0 {
		return frame{}, badFrame("%s request with status %d", name, f.status)
	}
	if keyLen > maxKeyLen || keyLen > len(rest) {
		return frame{}, badFrame("%s: key length %d (limit %d, %d bytes left)", name, keyLen, maxKeyLen, len(rest))
	}
	if keyLen > 0 && (f.op == opAuth || f.op == opReply) {
		return frame{}, badFrame("%s with a key", name)
	}
	key := rest[:keyLen]
	if !utf8.Valid(key) {
		return frame{}, badFrame("%s: key %q is not valid UTF-8", name, key)
	}
	f.key, f.value = string(key), rest[keyLen:]
	switch {
	case len(f.value) > 0 && (f.op == opGet || f.op == opAdd || f.op == opDelete):
		return frame{}, badFrame("%s %q with a %d-byte value", name, f.key, len(f.value))
	case f.op == opAuth && len(f.value) > maxTokenLen:
		return frame{}, badFrame("token of %d bytes (limit %d)", len(f.value), maxTokenLen)
	case len(f.value) > maxValueLen:
		return frame{}, badFrame("%s: value of %d bytes (limit %d)", name, len(f.value), maxValueLen)
	}
	return f, nil
}
