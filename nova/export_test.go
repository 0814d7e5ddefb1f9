package nova

// DecodeFast is Decode's fast path alone: ok is false when it leaves the
// message to the reference path.
func DecodeFast(body []byte) (m *Message, err error, ok bool) {
	w, ver, ok := fastWire(body, new([]byte))
	if !ok {
		return nil, nil, false
	}
	m, err = fromWire(&w, ver)
	return m, err, true
}

// DecodeReference is Decode's reference path (encoding/json) alone.
var DecodeReference = decodeReference

// DecodeDataFast is (*Message).Decode's fast path alone for the payload
// name (an instance payload or FlavorPayload): ok is false when it leaves
// the data to encoding/json.
func DecodeDataFast(name string, data []byte) (p Payload, ok bool) {
	switch {
	case name == "InstanceUpdatePayload":
		p = &InstanceUpdate{}
	case name == "FlavorPayload":
		p = &Flavor{}
	case IsInstanceAction(name):
		p = &InstanceAction{Name: name}
	default:
		return nil, false
	}
	return p, fastData(data, p)
}

// DecodeDataReference decodes the payload name's data with encoding/json.
func DecodeDataReference(name string, data []byte) (Payload, error) {
	var p Payload
	switch {
	case name == "InstanceUpdatePayload":
		p = &InstanceUpdate{}
	case name == "FlavorPayload":
		p = &Flavor{}
	default:
		p = &InstanceAction{Name: name}
	}
	return p, unmarshalObject(data, p)
}
