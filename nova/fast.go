package nova

import (
	"bytes"
	"strings"
	"sync"
	"unicode/utf8"
)

// The fast path of Decode. Nova's messages are ~4 KB of JSON carried as a
// JSON string inside the oslo envelope; encoding/json validates and then
// decodes every layer separately (the envelope, the string, the inner
// message), six passes in all. fastWire reads the envelope and the inner
// message in one pass each and unquotes oslo.message once into a []byte.
//
// It handles only the shape that decodes without surprises: well-formed
// JSON, the envelope holding exactly oslo.version and oslo.message as
// strings, the fields the bridge reads being strings or null, keys and
// strings valid UTF-8 without escaped surrogates, no key that matches a known
// field only case-insensitively, no repeated payload. For anything else it
// reports !ok and Decode runs the reference path (encoding/json), which
// gives the same result for what fastWire accepts (FuzzFastWire checks this)
// and the precise error for what is broken.

// maxDepth is encoding/json's nesting limit.
const maxDepth = 10000

type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

// eat skips whitespace and then c.
func (s *scanner) eat(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// skipString validates the string at s.i (its opening quote) and moves past
// it; raw is its content between the quotes, plain tells that it holds no
// escape and no byte above ASCII.
func (s *scanner) skipString() (raw []byte, plain, ok bool) {
	if s.peek() != '"' {
		return nil, false, false
	}
	start := s.i + 1
	plain = true
	for i := start; i < len(s.b); i++ {
		// Most of a notification's strings are runs of plain ASCII: pass
		// them with one table look per byte.
		for i < len(s.b) && plainASCII[s.b[i]] {
			i++
		}
		if i == len(s.b) {
			break
		}
		c := s.b[i]
		switch {
		case c == '"':
			s.i = i + 1
			return s.b[start:i], plain, true
		case c == '\\':
			plain = false
			i++
			if i >= len(s.b) {
				return nil, false, false
			}
			switch s.b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(s.b) || !isHex(s.b[i+1]) || !isHex(s.b[i+2]) || !isHex(s.b[i+3]) || !isHex(s.b[i+4]) {
					return nil, false, false
				}
				i += 4
			default:
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		case c >= utf8.RuneSelf:
			plain = false
		}
	}
	return nil, false, false
}

// plainASCII marks the bytes a JSON string holds as they are: ASCII, not
// a control character, a quote or a backslash.
var plainASCII = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str reads a string and returns its unquoted bytes: a slice of the input
// when it holds no escape, else a new buffer. It refuses invalid UTF-8 and
// escaped surrogates (encoding/json replaces those with U+FFFD; the
// reference path does that).
func (s *scanner) str() ([]byte, bool) { return s.strCopy() }

// strInto is str, unquoting into *dst (from its start; replaced by a
// buffer the size of the rest of the input when smaller) when the string
// holds an escape, in one pass: for a string that is most of the input,
// as oslo.message is.
func (s *scanner) strInto(dst *[]byte) ([]byte, bool) {
	b := s.b
	if s.peek() != '"' {
		return nil, false
	}
	start := s.i + 1
	i := start
	for i < len(b) && plainASCII[b[i]] {
		i++
	}
	if i < len(b) && b[i] == '"' {
		s.i = i + 1
		return b[start:i], true
	}
	if cap(*dst) < len(b)-start {
		*dst = make([]byte, 0, len(b)-start)
	}
	out := (*dst)[:0]
	out = append(out, b[start:i]...)
	ascii := true
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			s.i = i + 1
			// Escapes add valid UTF-8 only: out is valid iff the bytes
			// copied as they are were.
			if !ascii && !utf8.Valid(out) {
				return nil, false
			}
			return out, true
		case c == '\\':
			if i+1 >= len(b) {
				return nil, false
			}
			switch e := b[i+1]; {
			case simpleEscape[e] != 0:
				out = append(out, simpleEscape[e])
			case e == 'u':
				if i+5 >= len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return nil, false
				}
				r := rune(hexVal(b[i+2])<<12 | hexVal(b[i+3])<<8 | hexVal(b[i+4])<<4 | hexVal(b[i+5]))
				if r >= 0xD800 && r < 0xE000 {
					return nil, false
				}
				out = utf8.AppendRune(out, r)
				i += 4
			default:
				return nil, false
			}
			i += 2
		case c < 0x20:
			return nil, false
		default: // above ASCII
			ascii = false
			out = append(out, c)
			i++
		}
		j := i
		for j < len(b) && plainASCII[b[j]] {
			j++
		}
		out = append(out, b[i:j]...)
		i = j
	}
	return nil, false
}

// strCopy is str for a string with an escape or a byte above ASCII.
func (s *scanner) strCopy() ([]byte, bool) {
	raw, plain, ok := s.skipString()
	if !ok {
		return nil, false
	}
	if plain {
		return raw, true
	}
	// Escapes are ASCII and cut no UTF-8 sequence: raw is valid as a
	// whole iff each run between them is.
	if !utf8.Valid(raw) {
		return nil, false
	}
	out := make([]byte, 0, len(raw))
	for {
		j := bytes.IndexByte(raw, '\\')
		if j < 0 {
			return append(out, raw...), true
		}
		out = append(out, raw[:j]...)
		// skipString checked the escape.
		e := raw[j+1]
		raw = raw[j+2:]
		switch {
		case simpleEscape[e] != 0:
			out = append(out, simpleEscape[e])
		case e == 'u':
			r := rune(hexVal(raw[0])<<12 | hexVal(raw[1])<<8 | hexVal(raw[2])<<4 | hexVal(raw[3]))
			raw = raw[4:]
			if r >= 0xD800 && r < 0xE000 {
				return nil, false
			}
			out = utf8.AppendRune(out, r)
		}
	}
}

// simpleEscape maps the letter after a backslash in a JSON string to the
// byte it stands for (0: not one of JSON's one-letter escapes).
var simpleEscape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	}
	return int(c-'A') + 10
}

// key reads an object key and its colon. Keys that are not plain ASCII
// are refused (encoding/json folds Unicode case when it matches them).
func (s *scanner) key() ([]byte, bool) {
	s.ws()
	k, ok := s.str()
	if !ok {
		return nil, false
	}
	for _, c := range k {
		if c >= utf8.RuneSelf {
			return nil, false
		}
	}
	return k, s.eat(':')
}

// skipValue validates and skips any JSON value.
func (s *scanner) skipValue(depth int) bool {
	s.ws()
	switch c := s.peek(); {
	case c == '"':
		_, _, ok := s.skipString()
		return ok
	case c == '{' || c == '[':
		if depth >= maxDepth {
			return false
		}
		s.i++
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		if s.eat(end) {
			return true
		}
		for {
			if c == '{' {
				s.ws()
				if _, _, ok := s.skipString(); !ok || !s.eat(':') {
					return false
				}
			}
			if !s.skipValue(depth + 1) {
				return false
			}
			if s.eat(',') {
				continue
			}
			return s.eat(end)
		}
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	}
	return false
}

func (s *scanner) literal(l string) bool {
	if len(s.b)-s.i >= len(l) && string(s.b[s.i:s.i+len(l)]) == l {
		s.i += len(l)
		return true
	}
	return false
}

func (s *scanner) digits() int {
	n := 0
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

// number skips a number of JSON's grammar.
func (s *scanner) number() bool {
	if s.peek() == '-' {
		s.i++
	}
	switch c := s.peek(); {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		s.digits()
	default:
		return false
	}
	if s.peek() == '.' {
		s.i++
		if s.digits() == 0 {
			return false
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if s.digits() == 0 {
			return false
		}
	}
	return true
}

// end reports whether only whitespace is left.
func (s *scanner) end() bool {
	s.ws()
	return s.i == len(s.b)
}

// object calls field for each key of the object at s.i; field reads the
// value.
func (s *scanner) object(field func(key []byte) bool) bool {
	if !s.eat('{') {
		return false
	}
	if s.eat('}') {
		return true
	}
	for {
		k, ok := s.key()
		if !ok || !field(k) {
			return false
		}
		if s.eat(',') {
			continue
		}
		return s.eat('}')
	}
}

// strField reads a string or null into *p, as encoding/json does for a
// *string field.
func (s *scanner) strField(p **string) bool {
	s.ws()
	if s.peek() == 'n' {
		*p = nil
		return s.literal("null")
	}
	b, ok := s.str()
	if !ok {
		return false
	}
	v := string(b)
	*p = &v
	return true
}

// innerBufs are the buffers oslo.message is unquoted into (Decode).
var innerBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxKeptInnerBuf is the largest buffer innerBufs keeps.
const maxKeptInnerBuf = 64 << 10

// wireKeys are the keys of wire; objectKeys those of Object.
var (
	wireKeys = []string{"oslo.version", "oslo.message", "message_id", "publisher_id", "event_type", "priority",
		"timestamp", "payload", "_unique_id", "_context_request_id", "_context_global_request_id",
		"_context_project_id", "_context_user_id"}
	objectKeys = []string{"nova_object.name", "nova_object.namespace", "nova_object.version", "nova_object.data"}
)

// foldsTo reports whether k matches one of keys case-insensitively, as
// encoding/json would match it to a field.
func foldsTo(k []byte, keys []string) bool {
	for _, w := range keys {
		if len(w) == len(k) && strings.EqualFold(w, string(k)) {
			return true
		}
	}
	return false
}

// fastWire decodes body into w and returns the envelope version ("" for
// the legacy form); ok is false when the reference path must decide.
//
// The inner message is unquoted into *buf when it holds escapes (it does:
// its quotes); w refers to it, so the caller keeps buf until it has copied
// what it needs of w.
func fastWire(body []byte, buf *[]byte) (w wire, ver string, ok bool) {
	s := scanner{b: body}
	s.ws()
	if s.peek() != '{' {
		return w, "", false
	}
	// The envelope: exactly oslo.version and oslo.message, both strings.
	env := scanner{b: body, i: s.i + 1}
	if k, ok := env.key(); ok && (string(k) == "oslo.version" || string(k) == "oslo.message") {
		var inner []byte
		var hasVer, hasMsg bool
		ok := s.object(func(k []byte) bool {
			switch string(k) {
			case "oslo.version":
				v, ok := s.str()
				ver, hasVer = string(v), !hasVer && ok
				return hasVer
			case "oslo.message":
				if hasMsg {
					return false
				}
				v, ok := s.strInto(buf)
				inner, hasMsg = v, ok
				return hasMsg
			}
			return false
		})
		if !ok || !hasVer || !hasMsg || !s.end() {
			return w, "", false
		}
		if major, _, _ := strings.Cut(ver, "."); major != "2" {
			return w, "", false
		}
		w, ok = fastMessage(inner)
		return w, ver, ok
	}
	w, ok = fastMessage(body)
	return w, "", ok
}

// fastMessage decodes the inner message (or a legacy body) into a wire.
func fastMessage(b []byte) (w wire, ok bool) {
	s := scanner{b: b}
	var seenPayload bool
	ok = s.object(func(k []byte) bool {
		switch string(k) {
		case "message_id":
			return s.strField(&w.MessageID)
		case "publisher_id":
			return s.strField(&w.PublisherID)
		case "event_type":
			return s.strField(&w.EventType)
		case "priority":
			return s.strField(&w.Priority)
		case "timestamp":
			return s.strField(&w.Timestamp)
		case "_unique_id":
			return s.strField(&w.UniqueID)
		case "_context_request_id":
			return s.strField(&w.CtxRequestID)
		case "_context_global_request_id":
			return s.strField(&w.CtxGlobalRequestID)
		case "_context_project_id":
			return s.strField(&w.CtxProjectID)
		case "_context_user_id":
			return s.strField(&w.CtxUserID)
		case "payload":
			if seenPayload {
				return false
			}
			seenPayload = true
			return s.payload(&w.Payload)
		case "oslo.version", "oslo.message":
			return false
		}
		return !foldsTo(k, wireKeys) && s.skipValue(1)
	})
	return w, ok && s.end()
}

// payload reads the payload's nova_object header, leaving its data raw.
func (s *scanner) payload(p **Object) bool {
	s.ws()
	if s.peek() == 'n' {
		*p = nil
		return s.literal("null")
	}
	o := &Object{}
	*p = o
	str := func(dst *string) bool {
		s.ws()
		if s.peek() == 'n' {
			return s.literal("null") // a null leaves a string field as it is
		}
		b, ok := s.str()
		*dst = string(b)
		return ok
	}
	return s.object(func(k []byte) bool {
		switch string(k) {
		case "nova_object.name":
			return str(&o.Name)
		case "nova_object.namespace":
			return str(&o.Namespace)
		case "nova_object.version":
			return str(&o.Version)
		case "nova_object.data":
			s.ws()
			if s.peek() != '{' {
				return false
			}
			start := s.i
			if !s.skipValue(2) {
				return false
			}
			o.Data = s.b[start:s.i]
			return true
		}
		return !foldsTo(k, objectKeys) && s.skipValue(2)
	})
}
