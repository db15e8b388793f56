package wire

import (
	"bytes"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// MarshalSorted encodes v as msgpack with SetSortMapKeys (maps of
// strings, bools and interfaces in key order; msgpack writes other maps in
// Go's map order) and integers at their full width: for state kept in KV,
// written on every change. It shares Marshal's pooled encoders.
func MarshalSorted(v any) ([]byte, error) {
	return Marshal(v, func(enc *msgpack.Encoder) { enc.SetSortMapKeys(true) })
}

// Marshal encodes v on a pooled encoder set up by configure and
// returns a copy of the bytes. Each call starts from a fresh encoder's
// state (Reset clears every setting): a type of another package may intern
// strings (the dictionary would outlive its call) or change settings in
// its own EncodeMsgpack.
func Marshal(v any, configure func(*msgpack.Encoder)) ([]byte, error) {
	e := encoders.Get().(*pooledEncoder)
	defer e.put()
	e.enc.Reset(&e.buf)
	configure(e.enc)
	if err := e.enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.Clone(e.buf.Bytes()), nil
}

// encoders keeps msgpack encoders with their buffers between Marshal
// calls (events.Marshal, MarshalSorted): every stored output is encoded,
// and a new encoder writing into a buffer grown from empty was a quarter
// of an encoding's allocations (events' BenchmarkMarshal).
var encoders = sync.Pool{New: func() any {
	e := &pooledEncoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}}

// MaxPooledBuffer: an encoder whose buffer grew past it (one large
// payload) is dropped rather than kept; events' pooled decoders use it
// too.
const MaxPooledBuffer = 64 << 10

type pooledEncoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
}

func (e *pooledEncoder) put() {
	if e.buf.Cap() > MaxPooledBuffer {
		return
	}
	e.buf.Reset()
	encoders.Put(e)
}

// IsMsgpackMap reports whether data starts a msgpack map (fixmap, map16,
// map32): the shape of every failbus record, and never of JSON text.
func IsMsgpackMap(data []byte) bool {
	return len(data) > 0 && (data[0]&0xf0 == 0x80 || data[0] == 0xde || data[0] == 0xdf)
}
