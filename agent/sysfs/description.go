package sysfs

import (
	"fmt"
	"strconv"
	"strings"
)

// Description is NVIDIA's mdev type description, e.g.
// "num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=7680x4320, max_instance=12".
// Unknown keys are kept in Extra; missing keys stay zero.
type Description struct {
	NumHeads      int               `json:"num_heads,omitempty"`
	FRLConfig     int               `json:"frl_config,omitempty"`
	FramebufferMB uint64            `json:"framebuffer_mb,omitempty"`
	MaxResolution string            `json:"max_resolution,omitempty"` // "7680x4320"
	MaxWidth      int               `json:"-"`
	MaxHeight     int               `json:"-"`
	MaxInstance   int               `json:"max_instance,omitempty"`
	Extra         map[string]string `json:"extra,omitempty"`
}

// ParseDescription parses NVIDIA's key=value description. Pairs are separated
// by commas (and/or newlines); whitespace is ignored. It returns what it could
// parse plus an error naming the first bad pair.
func ParseDescription(s string) (Description, error) {
	var d Description
	var firstErr error
	fail := func(err error) {
		if firstErr == nil {
			firstErr = err
		}
	}
	for _, pair := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '\n' }) {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			fail(fmt.Errorf("description: no '=' in %q", pair))
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		var err error
		switch k {
		case "num_heads":
			d.NumHeads, err = atoiNonNeg(v)
		case "frl_config":
			d.FRLConfig, err = atoiNonNeg(v)
		case "max_instance":
			d.MaxInstance, err = atoiNonNeg(v)
		case "framebuffer":
			d.FramebufferMB, err = parseSizeMB(v)
		case "max_resolution":
			w, h, ok := strings.Cut(v, "x")
			var e1, e2 error
			d.MaxWidth, e1 = atoiNonNeg(w)
			d.MaxHeight, e2 = atoiNonNeg(h)
			if !ok || e1 != nil || e2 != nil {
				d.MaxWidth, d.MaxHeight = 0, 0
				err = fmt.Errorf("bad resolution")
			} else {
				d.MaxResolution = v
			}
		default:
			if d.Extra == nil {
				d.Extra = map[string]string{}
			}
			d.Extra[k] = v
		}
		if err != nil {
			fail(fmt.Errorf("description: %s=%q: %w", k, v, err))
		}
	}
	return d, firstErr
}

func atoiNonNeg(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("negative")
	}
	return n, nil
}

// parseSizeMB reads "2048M", "1G", "1024" (MiB), "512K" (rounded down).
func parseSizeMB(s string) (uint64, error) {
	mul, div := uint64(1), uint64(1)
	switch {
	case strings.HasSuffix(s, "G"), strings.HasSuffix(s, "g"):
		mul, s = 1024, s[:len(s)-1]
	case strings.HasSuffix(s, "M"), strings.HasSuffix(s, "m"):
		s = s[:len(s)-1]
	case strings.HasSuffix(s, "K"), strings.HasSuffix(s, "k"):
		div, s = 1024, s[:len(s)-1]
	}
	n, err := strconv.ParseUint(s, 10, 40)
	if err != nil {
		return 0, err
	}
	return n * mul / div, nil
}
