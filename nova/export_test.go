package nova

// DecodeFast is Decode's fast path alone: ok is false when it leaves the
// message to the reference path.
func DecodeFast(body []byte) (m *Message, err error, ok bool) {
	w, ver, ok := fastWire(body)
	if !ok {
		return nil, nil, false
	}
	m, err = fromWire(&w, ver)
	return m, err, true
}

// DecodeReference is Decode's reference path (encoding/json) alone.
var DecodeReference = decodeReference
