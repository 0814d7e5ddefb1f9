package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// maxFileBytes bounds what a loader reads.
const maxFileBytes = 4 << 20

// walker reads a yaml.v3 node tree, collecting positioned errors.
type walker struct {
	errs []Error
}

func (w *walker) errf(n *yaml.Node, format string, a ...any) {
	e := Error{Msg: fmt.Sprintf(format, a...)}
	if n != nil {
		e.Line, e.Col = n.Line, n.Column
	}
	w.errs = append(w.errs, e)
}

// readDoc reads at most maxFileBytes and parses one YAML document. It
// returns nil, nil for an empty document.
func readDoc(r io.Reader) (*yaml.Node, []byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxFileBytes+1))
	if err != nil {
		return nil, nil, err
	}
	if len(data) > maxFileBytes {
		return nil, nil, &LoadError{Errors: []Error{{Msg: fmt.Sprintf("file larger than %d bytes", maxFileBytes)}}}
	}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, data, nil
		}
		return nil, nil, &LoadError{Errors: []Error{yamlSyntaxError(err)}}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	return root, data, nil
}

// yamlSyntaxError turns "yaml: line 3: ..." into an Error.
func yamlSyntaxError(err error) Error {
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "yaml: line "); ok {
		if i := strings.IndexByte(rest, ':'); i > 0 {
			if n, err := strconv.Atoi(rest[:i]); err == nil {
				return Error{Line: n, Col: 1, Msg: "YAML syntax: " + strings.TrimSpace(rest[i+1:])}
			}
		}
	}
	return Error{Msg: "YAML syntax: " + strings.TrimPrefix(msg, "yaml: ")}
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// mapping calls fn for each key of a mapping node, reporting keys not in
// allowed (nil: any key) and duplicates.
func (w *walker) mapping(n *yaml.Node, what string, allowed []string, fn func(key string, k, v *yaml.Node)) {
	if isNull(n) {
		return
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		w.errf(n, "%s must be a mapping", what)
		return
	}
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			w.errf(k, "%s: keys must be strings", what)
			continue
		}
		if prev, dup := seen[k.Value]; dup {
			w.errf(k, "%s: key %q repeated (first at %d:%d)", what, k.Value, prev.Line, prev.Column)
			continue
		}
		seen[k.Value] = k
		if allowed != nil && !contains(allowed, k.Value) {
			w.errf(k, "%s: unknown key %q (want one of %s)", what, k.Value, strings.Join(allowed, ", "))
			continue
		}
		if v.Kind == yaml.AliasNode {
			v = v.Alias
		}
		fn(k.Value, k, v)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (w *walker) scalar(n *yaml.Node, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		w.errf(n, "%s must be a scalar value", what)
		return "", false
	}
	return n.Value, true
}

func (w *walker) str(n *yaml.Node, what string) string {
	s, _ := w.scalar(n, what)
	return s
}

func (w *walker) integer(n *yaml.Node, what string, min, max int) (int, bool) {
	s, ok := w.scalar(n, what)
	if !ok {
		return 0, false
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < min || v > max {
		w.errf(n, "%s %q: want an integer from %d to %d", what, s, min, max)
		return 0, false
	}
	return v, true
}

func (w *walker) boolean(n *yaml.Node, what string) bool {
	s, ok := w.scalar(n, what)
	if !ok {
		return false
	}
	switch s {
	case "true", "yes", "on":
		return true
	case "false", "no", "off":
		return false
	}
	w.errf(n, "%s %q: want true or false", what, s)
	return false
}

func (w *walker) duration(n *yaml.Node, what string) time.Duration {
	s, ok := w.scalar(n, what)
	if !ok {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > 30*24*time.Hour {
		w.errf(n, "%s %q: want a duration such as 90s, 5m or 1h30m (at most 720h)", what, s)
		return 0
	}
	return d
}

// strList accepts a sequence of scalars or one scalar.
func (w *walker) strList(n *yaml.Node, what string) ([]string, []*yaml.Node) {
	if isNull(n) {
		return nil, nil
	}
	if n.Kind == yaml.ScalarNode {
		return []string{n.Value}, []*yaml.Node{n}
	}
	if n.Kind != yaml.SequenceNode {
		w.errf(n, "%s must be a list", what)
		return nil, nil
	}
	var out []string
	var nodes []*yaml.Node
	for _, it := range n.Content {
		if s, ok := w.scalar(it, what+" item"); ok {
			out = append(out, s)
			nodes = append(nodes, it)
		}
	}
	return out, nodes
}
