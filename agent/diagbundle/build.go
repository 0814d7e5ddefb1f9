// SPDX-License-Identifier: Apache-2.0

package diagbundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"time"
)

// overheadPerPart reserves a tar header and the last block's padding per
// part; fixedOverhead the manifest's room, the end-of-archive blocks and
// gzip's framing.
const (
	overheadPerPart = 1024
	fixedOverhead   = 16 << 10
)

// Fit truncates the largest parts until their data fits budget bytes in
// total, and records in each cut part why. It reports whether anything was
// cut.
func Fit(parts []Part, budget int) bool {
	total := 0
	for _, p := range parts {
		total += len(p.Data)
	}
	over := total - max(budget, 0)
	cut := false
	for over > 0 {
		// The largest part and the size of the next one down.
		big, second, nBig := -1, 0, 0
		for i, p := range parts {
			switch {
			case big < 0 || len(p.Data) > len(parts[big].Data):
				if big >= 0 {
					second = len(parts[big].Data)
				}
				big, nBig = i, 1
			case len(p.Data) == len(parts[big].Data):
				nBig++
			case len(p.Data) > second:
				second = len(p.Data)
			}
		}
		size := len(parts[big].Data)
		if size == 0 {
			break
		}
		n := size - second // bring it down to the next one
		if nBig > 1 || n == 0 {
			n = (over + nBig - 1) / nBig // equal largest parts share the cut
		}
		n = min(n, over, size)
		p := &parts[big]
		if p.OriginalSize == 0 {
			p.OriginalSize = size
		}
		if p.KeepTail {
			p.Data = p.Data[n:]
		} else {
			p.Data = p.Data[:size-n]
		}
		over -= n
		cut = true
	}
	for i := range parts {
		if p := &parts[i]; p.OriginalSize > 0 {
			where := "end"
			if p.KeepTail {
				where = "start"
			}
			p.Truncated = fmt.Sprintf("bundle over its limit: cut from %d to %d bytes at the %s", p.OriginalSize, len(p.Data), where)
		}
	}
	return cut
}

// Build fits parts into m.MaxBytes and writes them, then MANIFEST.json,
// into a tar.gz; m.Parts is filled.
func Build(parts []Part, m *Manifest) ([]byte, error) {
	budget := m.MaxBytes - fixedOverhead - overheadPerPart*(len(parts)+1)
	budget -= m.MaxBytes / 100 // gzip may grow incompressible data a little
	Fit(parts, budget)
	m.Parts = m.Parts[:0]
	for _, p := range parts {
		e := ManifestEntry{Name: p.Name, Size: len(p.Data), Skipped: p.Skipped, Truncated: p.Truncated}
		if p.Truncated != "" {
			e.OriginalSize = p.OriginalSize
		}
		m.Parts = append(m.Parts, e)
	}
	man, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	mod := m.CollectedAt
	if mod.IsZero() {
		mod = time.Now()
	}
	write := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: mod, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, p := range parts {
		if p.Skipped != "" {
			continue
		}
		if err := write(p.Name, p.Data); err != nil {
			return nil, fmt.Errorf("bundle part %s: %w", p.Name, err)
		}
	}
	if err := write(PartManifest, man); err != nil {
		return nil, fmt.Errorf("bundle manifest: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if buf.Len() > m.MaxBytes {
		return nil, fmt.Errorf("bundle is %d bytes, over its limit of %d", buf.Len(), m.MaxBytes)
	}
	return buf.Bytes(), nil
}
