// Package novatest holds test helpers for Nova notifications: it loads
// Nova's versioned-notification samples (doc/notification_samples) and
// resolves their "$ref"s the way nova/tests/json_ref.py does.
package novatest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/vgpu-bridge/vgpu-bridge/nova"
)

// Sample is one resolved notification sample.
type Sample struct {
	Name string // file name without ".json", e.g. "instance-create-end"
	Path string
	JSON []byte // resolved, {"event_type", "payload", "priority", "publisher_id"}
}

// ResolveFile reads a sample and resolves every "$ref" in it: the path is
// relative to the directory of the file holding the ref, "#" and what follows
// is ignored, the referenced file is resolved recursively, and the sibling
// keys of "$ref" are deep-merged over the result (objects merge, anything
// else replaces).
func ResolveFile(path string) ([]byte, error) {
	v, err := resolveFile(path, 0)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func resolveFile(path string, depth int) (any, error) {
	if depth > 32 {
		return nil, fmt.Errorf("%s: $ref nesting deeper than 32", path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return resolve(v, filepath.Dir(path), depth)
}

func resolve(v any, dir string, depth int) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		if ref, ok := t["$ref"].(string); ok {
			file, _, _ := strings.Cut(ref, "#")
			base, err := resolveFile(filepath.Join(dir, file), depth+1)
			if err != nil {
				return nil, err
			}
			for k, ov := range t {
				if k == "$ref" {
					continue
				}
				ov, err := resolve(ov, dir, depth)
				if err != nil {
					return nil, err
				}
				base = merge(base, k, ov)
			}
			return base, nil
		}
		for k, e := range t {
			r, err := resolve(e, dir, depth)
			if err != nil {
				return nil, err
			}
			t[k] = r
		}
		return t, nil
	case []any:
		for i, e := range t {
			r, err := resolve(e, dir, depth)
			if err != nil {
				return nil, err
			}
			t[i] = r
		}
		return t, nil
	}
	return v, nil
}

// merge sets key k of base to override, deep-merging objects.
func merge(base any, k string, override any) any {
	m, ok := base.(map[string]any)
	if !ok {
		return base
	}
	m[k] = deepMerge(m[k], override)
	return m
}

func deepMerge(dst, src any) any {
	dm, ok1 := dst.(map[string]any)
	sm, ok2 := src.(map[string]any)
	if !ok1 || !ok2 {
		return src
	}
	for k, v := range sm {
		dm[k] = deepMerge(dm[k], v)
	}
	return dm
}

// Samples loads and resolves every top-level *.json in dir (not
// common_payloads/), sorted by name.
func Samples(dir string) ([]Sample, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	var out []Sample
	for _, p := range paths {
		b, err := ResolveFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, Sample{Name: strings.TrimSuffix(filepath.Base(p), ".json"), Path: p, JSON: b})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no samples in %s", dir)
	}
	return out, nil
}

// SamplesDir is where the nova package keeps its copy of Nova's samples,
// relative to the module root.
const SamplesDir = "nova/testdata/notification_samples"

// Wire builds the wire message of sample s with message id id and
// timestamp ts (see nova.WireMessage).
func (s Sample) Wire(id string, ts time.Time) []byte {
	b, err := nova.WireMessage(s.JSON, id, ts)
	if err != nil {
		panic(fmt.Sprintf("novatest: %s: %v", s.Name, err))
	}
	return b
}
