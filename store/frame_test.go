package store

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, f := range []frame{
		{op: opAuth, num: protocolVersion, value: []byte("token")},
		{op: opSet, id: 1, key: "k", value: []byte{0, 1, 2}},
		{op: opGet, id: 2, key: "秩/0", num: -1},
		{op: opAdd, id: 1 << 63, key: "n", num: -42},
		{op: opDelete, id: 3, key: ""},
		{op: opReply, status: statusTimeout, id: 2, value: []byte("store: timeout")},
	} {
		b := appendFrame(nil, f)
		n, err := readFrameLen(bytes.NewReader(b), maxFrame)
		require.NoError(t, err)
		require.Equal(t, len(b)-4, n)
		got, err := decodeFrame(b[4:])
		require.NoError(t, err)
		if f.value == nil {
			f.value = []byte{}
		}
		require.Equal(t, f, got)
	}
}

func TestReadFrameBodyTruncated(t *testing.T) {
	for _, n := range []int{100, 1 << 20} { // the eager and the growing path
		_, err := readFrameBody(bytes.NewReader(make([]byte, n/2)), n)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		require.ErrorContains(t, err, "inside a frame")
	}
}

// FuzzDecodeFrame feeds arbitrary bytes to the decoder, alone and as a
// stream through the length-checked reader the server uses. It must never
// panic; what it accepts is within the limits and re-encodes to the same
// bytes, and what it refuses is a frameError.
func FuzzDecodeFrame(f *testing.F) {
	for _, fr := range []frame{
		{op: opAuth, num: protocolVersion, value: []byte("tok")},
		{op: opSet, id: 7, key: "symm/0/meta/1", value: []byte(`{"pid":1}`)},
		{op: opGet, id: 8, key: "k", num: 1e9},
		{op: opAdd, id: 9, key: "n", num: 1},
		{op: opDelete, id: 10, key: "k"},
		{op: opReply, id: 8, status: statusClosed, value: []byte("closed")},
	} {
		b := appendFrame(nil, fr)
		f.Add(b[4:])
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := decodeFrame(data)
		if err != nil {
			var fe *frameError
			require.True(t, errors.As(err, &fe), "%v", err)
		} else {
			require.LessOrEqual(t, len(fr.key), maxKeyLen)
			require.LessOrEqual(t, len(fr.value), maxValueLen)
			require.Equal(t, data, appendFrame(nil, fr)[4:])
		}

		r := bytes.NewReader(data)
		for {
			n, err := readFrameLen(r, maxAuthFrame)
			if err != nil {
				return
			}
			body, err := readFrameBody(r, n)
			if err != nil {
				return
			}
			if _, err := decodeFrame(body); err != nil {
				return
			}
		}
	})
}
