package catalog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// PosError is one problem in a profiles file, with its position (1-based;
// 0 when unknown).
type PosError struct {
	Line, Col int
	Msg       string
}

func (e PosError) Error() string {
	if e.Line == 0 {
		return e.Msg
	}
	return fmt.Sprintf("%d:%d: %s", e.Line, e.Col, e.Msg)
}

// LoadError holds every problem found in a profiles file.
type LoadError struct {
	File   string
	Errors []PosError
}

func (e *LoadError) Error() string {
	var b strings.Builder
	for i, pe := range e.Errors {
		if i > 0 {
			b.WriteByte('\n')
		}
		if e.File != "" {
			b.WriteString(e.File)
			b.WriteByte(':')
		}
		b.WriteString(pe.Error())
	}
	return b.String()
}

// maxFileBytes bounds what Load reads.
const maxFileBytes = 4 << 20

// LoadFile reads a profiles file (etc/vgpu-bridge/profiles.yaml).
func LoadFile(path string) (*Catalog, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load profiles: %w", err)
	}
	defer f.Close()
	c, err := Load(f)
	var le *LoadError
	if errors.As(err, &le) {
		le.File = path
	}
	return c, err
}

// Load reads a profiles document:
//
//	profiles:
//	  - name: T4-4Q          # required; any form ParseName accepts
//	    type_id: nvidia-232  # optional: learned from agents when absent
//	    max_instances: 4     # optional: per physical GPU
//
// Every problem is reported, with its line and column, in a *LoadError.
func Load(r io.Reader) (*Catalog, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("load profiles: %w", err)
	}
	if len(data) > maxFileBytes {
		return nil, &LoadError{Errors: []PosError{{Msg: fmt.Sprintf("file larger than %d bytes", maxFileBytes)}}}
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return New(), nil
		}
		return nil, &LoadError{Errors: []PosError{yamlPos(err)}}
	}
	var errs []PosError
	add := func(n *yaml.Node, format string, a ...any) {
		errs = append(errs, PosError{Line: n.Line, Col: n.Column, Msg: fmt.Sprintf(format, a...)})
	}
	c := New()
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind != yaml.MappingNode {
		add(root, "want a mapping with key \"profiles\"")
		return nil, &LoadError{Errors: errs}
	}
	var list *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch k.Value {
		case "profiles":
			list = v
		default:
			add(k, "unknown key %q (want \"profiles\")", k.Value)
		}
	}
	if list != nil && list.Kind != yaml.SequenceNode && !(list.Kind == yaml.ScalarNode && list.Tag == "!!null") {
		add(list, "\"profiles\" must be a list")
		list = nil
	}
	seenType := map[string]*yaml.Node{}
	seenName := map[string]*yaml.Node{}
	if list != nil {
		for _, item := range list.Content {
			if item.Kind != yaml.MappingNode {
				add(item, "a profile must be a mapping with name, type_id, max_instances")
				continue
			}
			var name, typeID string
			var nameNode, typeNode *yaml.Node
			maxInst := 0
			ok := true
			for i := 0; i+1 < len(item.Content); i += 2 {
				k, v := item.Content[i], item.Content[i+1]
				if k.Value == "name" {
					nameNode = v
				}
				if v.Kind != yaml.ScalarNode {
					add(v, "%s must be a scalar", k.Value)
					ok = false
					continue
				}
				switch k.Value {
				case "name":
					name, nameNode = v.Value, v
				case "type_id":
					typeID, typeNode = v.Value, v
					if err := checkTypeID(typeID); err != nil {
						add(v, "%v", err)
						ok = false
					}
				case "max_instances":
					n, err := strconv.Atoi(v.Value)
					if err != nil || n < 0 || n > 4096 {
						add(v, "max_instances %q: want an integer from 0 to 4096", v.Value)
						ok = false
					}
					maxInst = n
				default:
					add(k, "unknown key %q (want name, type_id, max_instances)", k.Value)
				}
			}
			if nameNode == nil {
				add(item, "profile without a name")
				continue
			}
			if !ok {
				continue
			}
			p, err := NewProfile(typeID, name, maxInst)
			if err != nil {
				add(nameNode, "%v", err)
				continue
			}
			if prev, dup := seenName[p.Name]; dup {
				add(nameNode, "profile %s already defined at %d:%d", p.Name, prev.Line, prev.Column)
				continue
			}
			seenName[p.Name] = nameNode
			if typeID != "" {
				if prev, dup := seenType[typeID]; dup {
					add(typeNode, "type id %s already used at %d:%d", typeID, prev.Line, prev.Column)
					continue
				}
				seenType[typeID] = typeNode
			}
			c.addLocked(p)
		}
	}
	if len(errs) > 0 {
		return nil, &LoadError{Errors: errs}
	}
	return c, nil
}

func checkTypeID(s string) error {
	if s == "" || len(s) > 64 {
		return fmt.Errorf("type id %q: want 1 to 64 characters", s)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("type id %q: character %q not allowed (want letters, digits, - _ .)", s, r)
		}
	}
	return nil
}

// yamlPos turns a yaml.v3 syntax error ("yaml: line 3: ...") into a PosError.
func yamlPos(err error) PosError {
	msg := err.Error()
	rest, ok := strings.CutPrefix(msg, "yaml: line ")
	if ok {
		if i := strings.IndexByte(rest, ':'); i > 0 {
			if n, err := strconv.Atoi(rest[:i]); err == nil {
				return PosError{Line: n, Col: 1, Msg: strings.TrimSpace(rest[i+1:])}
			}
		}
	}
	return PosError{Msg: msg}
}
