package requests

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// lifecycleWrite finds SQL that writes a table of the request lifecycle.
var lifecycleWrite = regexp.MustCompile(`(?is)\b(insert\s+into|update|delete\s+from)\s+(requests|commands|vgpu_attachments|decisions|vgpu_usage)\b`)

// TestOneOwner fails when a production package other than this one writes
// (INSERT, UPDATE, DELETE) the requests, commands, vgpu_attachments,
// decisions or vgpu_usage tables: the lifecycle has one owner, and this package's verbs
// are how the others change it. Tests and their fixtures may write them.
func TestOneOwner(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	var checked int
	var found []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch name := d.Name(); {
			case path == self, name == "tests", name == "testdata", name == "vendor", strings.HasPrefix(name, "."):
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			if m := lifecycleWrite.FindString(s); m != "" {
				rel, _ := filepath.Rel(root, path)
				found = append(found, rel+":"+strconv.Itoa(fset.Position(lit.Pos()).Line)+": "+strings.Join(strings.Fields(m), " "))
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("only %d Go files checked under %s; the walk is broken", checked, root)
	}
	for _, f := range found {
		t.Errorf("%s: only package requests writes the request lifecycle; call its verbs (lifecycle.go)", f)
	}
}

// TestOneOwnerPattern: the pattern catches the statement forms in use and
// leaves reads alone.
func TestOneOwnerPattern(t *testing.T) {
	for _, tc := range []struct {
		sql   string
		write bool
	}{
		{"UPDATE requests SET state = $2", true},
		{"update  vgpu_attachments\n\tset state", true},
		{"INSERT INTO commands (id) VALUES ($1)", true},
		{"WITH r AS (DELETE FROM decisions WHERE x) SELECT 1", true},
		{"INSERT INTO requests_archive (id) VALUES ($1)", false},
		{"SELECT state FROM requests WHERE id = $1 FOR UPDATE", false},
		{"SELECT * FROM commands c JOIN requests r ON r.id = c.request_id", false},
		{"UPDATE drift_findings SET repair_request_id = $3", false},
	} {
		if got := lifecycleWrite.MatchString(tc.sql); got != tc.write {
			t.Errorf("%q: write = %v, want %v", tc.sql, got, tc.write)
		}
	}
}
