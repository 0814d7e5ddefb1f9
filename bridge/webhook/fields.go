package webhook

import (
	"encoding/json"
	"unicode/utf8"
)

// objectFields splits a JSON object into its members, as json.Unmarshal
// into a map[string]json.RawMessage does (the last of a repeated name
// wins), in one pass and without copying the values: they are slices of
// b, valid while b is. b must be valid JSON (json.Valid), as the webhook
// handler has checked before it decodes; ok is false when b is not an
// object, or (for input that is not valid JSON after all) when the scan
// goes wrong, and the caller then falls back to json.Unmarshal.
func objectFields(b []byte) (fields map[string]json.RawMessage, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	fields = map[string]json.RawMessage{}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return fields, skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, false
		}
		end, plain := stringEnd(b, i)
		if end < 0 {
			return nil, false
		}
		var key string
		if plain {
			key = string(b[i+1 : end-1])
		} else if json.Unmarshal(b[i:end], &key) != nil {
			return nil, false
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i = skipSpace(b, i+1)
		start := i
		if i = valueEnd(b, i); i < 0 {
			return nil, false
		}
		fields[key] = b[start:i:i]
		i = skipSpace(b, i)
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return fields, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the string that opens at b[i]
// (a '"'), or -1; plain tells that it holds printable ASCII only, no
// escape: its text is its bytes.
func stringEnd(b []byte, i int) (end int, plain bool) {
	plain = true
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j + 1, plain
		case c == '\\':
			plain = false
			j++ // the escaped byte; \uXXXX's digits need no care
		case c < 0x20 || c >= utf8.RuneSelf:
			plain = false
		}
	}
	return -1, false
}

// valueEnd returns the index just past the JSON value that starts at
// b[i], or -1.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		end, _ := stringEnd(b, i)
		return end
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, _ := stringEnd(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) {
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			if j == i {
				return -1
			}
			return j
		}
		j++
	}
	if j == i {
		return -1
	}
	return j
}
