package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
)

// maxDepth bounds the nesting of a message being canonicalized.
const maxDepth = 32

// Canonical returns the canonical form of a message body: the JSON
// Canonicalization Scheme of RFC 8785 (members sorted by their UTF-16
// code units, no white space, numbers as ECMAScript prints a double,
// strings with only the escapes JSON requires) applied to the body's top
// object with its "sig" member removed. Every other member is kept,
// including ones this version does not know, so a newer sender's fields
// are covered by the signature too. The body must be one JSON object
// without duplicate member names.
func Canonical(body []byte) ([]byte, error) {
	obj, err := parseObject(body)
	if err != nil {
		return nil, err
	}
	delete(obj, "sig")
	var b bytes.Buffer
	writeCanonical(&b, obj)
	return b.Bytes(), nil
}

// parseObject decodes body as exactly one JSON object, numbers kept as
// json.Number, rejecting duplicate member names.
func parseObject(body []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	t, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("canonical: %w", err)
	}
	if d, ok := t.(json.Delim); !ok || d != '{' {
		return nil, errors.New("canonical: not a JSON object")
	}
	v, err := parseAfter(dec, json.Delim('{'), 1)
	if err != nil {
		return nil, fmt.Errorf("canonical: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("canonical: trailing data after the JSON object")
	}
	return v.(map[string]any), nil
}

// parseAfter reads the rest of a value whose first token was t.
func parseAfter(dec *json.Decoder, t json.Token, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxDepth)
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '{':
			obj := map[string]any{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := kt.(string)
				if !ok {
					return nil, errors.New("object member name is not a string")
				}
				if _, dup := obj[k]; dup {
					return nil, fmt.Errorf("duplicate member %q", k)
				}
				vt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := parseAfter(dec, vt, depth+1)
				if err != nil {
					return nil, err
				}
				obj[k] = v
			}
			if _, err := dec.Token(); err != nil { // '}'
				return nil, err
			}
			return obj, nil
		case '[':
			arr := []any{}
			for dec.More() {
				vt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				v, err := parseAfter(dec, vt, depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			if _, err := dec.Token(); err != nil { // ']'
				return nil, err
			}
			return arr, nil
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, fmt.Errorf("number %s is out of range", t)
		}
		return f, nil
	case string, bool, nil:
		return t, nil
	}
	return nil, fmt.Errorf("unexpected token %v", t)
}

func writeCanonical(b *bytes.Buffer, v any) {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, compareUTF16)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, k)
			b.WriteByte(':')
			writeCanonical(b, v[k])
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonical(b, e)
		}
		b.WriteByte(']')
	case float64:
		if v == 0 {
			b.WriteByte('0') // -0 too
			return
		}
		// encoding/json prints a float64 as ECMAScript's Number::toString.
		out, _ := json.Marshal(v)
		b.Write(out)
	case string:
		writeString(b, v)
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case nil:
		b.WriteString("null")
	}
}

// writeString writes s as RFC 8785 requires: \" \\ \b \f \n \r \t, other
// controls as \u00xx, everything else as UTF-8.
func writeString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte(hex[r>>4])
			b.WriteByte(hex[r&0xf])
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

// compareUTF16 orders strings by their UTF-16 code units (RFC 8785, section 3.2.3).
func compareUTF16(a, b string) int {
	return slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
}
