package requests

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// owners maps every table of migrations/*.sql to the one package (its
// directory under the module root) whose production code writes it. A
// table missing here fails TestOneOwner: adding a table means choosing its
// owner, and the others call that package's verbs.
var owners = map[string]string{
	// The request lifecycle and what hangs off it: package requests.
	"requests":                  "bridge/requests",
	"commands":                  "bridge/requests",
	"vgpu_attachments":          "bridge/requests",
	"decisions":                 "bridge/requests",
	"vgpu_usage":                "bridge/requests",
	"audit_log":                 "bridge/requests",
	"events":                    "bridge/requests",
	"nova_resizes":              "bridge/requests",
	"request_callbacks":         "bridge/requests",
	"request_callback_attempts": "bridge/requests",
	"planned_claims":            "bridge/requests",
	"planned_releases":          "bridge/requests",
	"planned_finishes":          "bridge/requests",

	// Each feature's own records.
	"vgpu_usage_periods":     "bridge/usage",
	"vgpu_usage_exists":      "bridge/usage",
	"webhook_idempotency":    "bridge/webhook",
	"webhook_signed_bodies":  "bridge/webhook",
	"webhook_alerts":         "bridge/webhook",
	"bridge_controls":        "bridge/controls",
	"bridge_notifications":   "bridge/notify",
	"dead_letters":           "bridge/ingest",
	"instances":              "bridge/ingest",
	"instance_load":          "bridge/dispatch",
	"hosts":                  "bridge/ingest",
	"gpus":                   "placement/mirror",
	"flavors":                "bridge/ingest",
	"nova_server_sync":       "bridge/ingest",
	"drift_runs":             "bridge/drift",
	"drift_findings":         "bridge/drift",
	"diagnostics":            "bridge/diagnostics",
	"maintenance_operations": "bridge/maintenance",
	"maintenance_vms":        "bridge/maintenance",
	"fleet_upgrades":         "bridge/fleetupgrade",
	"fleet_upgrade_hosts":    "bridge/fleetupgrade",
	"policy_load_since":      "bridge/policystate",
	"policy_last_change":     "bridge/policystate",
	"owned_gpu_types":        "placement", // re-types of bridge-owned GPUs (placement/retype.go)

	// The mirror of Placement.
	"placement_providers":   "placement/mirror",
	"placement_inventories": "placement/mirror",
	"placement_usages":      "placement/mirror",
	"placement_allocations": "placement/mirror",
	"placement_aggregates":  "placement/mirror",
	"placement_traits":      "placement/mirror",
	"placement_sync_state":  "placement/mirror",
}

// sharedWriters lists, by table, the packages besides its owner that
// still write it, and why. Each is a debt (the write belongs behind a
// verb of the owner), never the place for a new writer: a write by a
// package neither owns nor is listed here fails TestOneOwner.
var sharedWriters = map[string]map[string]string{
	"hosts": {
		"bridge/dispatch": "an agent's report records its host",
		"bridge/controls": "drain and undrain",
	},
	"gpus": {
		"bridge/dispatch": "an agent's report records its GPUs",
		"bridge/controls": "drain and undrain",
	},
	"dead_letters":       {"bridge/dispatch": "an agent message it cannot read"},
	"instance_load":      {"bridge/pipeline": "forgets the load windows it no longer reads"},
	"diagnostics":        {"bridge/controls": "the retention purge"},
	"vgpu_usage_periods": {"bridge/requests": "PurgeUsage deletes the closed periods with the usage they froze"},
	// CreateWebhook writes an accepted batch in one statement: the
	// requests and events it makes with the endpoint's plain claims
	// (INSERTs of rows bridge/webhook builds; it alone reads, expires and
	// resolves them).
	"webhook_idempotency":   {"bridge/requests": "CreateWebhook claims an accepted batch's keys in the statement that makes its requests"},
	"webhook_signed_bodies": {"bridge/requests": "CreateWebhook claims an accepted batch's signed bodies in the statement that makes its requests"},
}

// dynamicWriters lists the packages allowed to write a table named at run
// time, with why. Anywhere else, SQL that writes a table whose name is not
// in the source fails TestOneOwner, since nobody could tell its owner.
var dynamicWriters = map[string]string{
	"bridge/requests":  "PurgeFinal deletes the rows of every table with a foreign key to a purged request",
	"placement/mirror": "clears its own placement_* child rows of the providers it rewrites",
}

// tableWrite finds a statement that writes a table: the verb, then the
// table's name or \x00 where the name is built at run time (a %s of a
// Sprintf, a variable in a concatenation, the end of a fragment).
var tableWrite = regexp.MustCompile(`(?is)\b(insert\s+into|update|delete\s+from|truncate(?:\s+table)?|merge\s+into|copy)\s+(?:only\s+)?(?:public\.)?("?[a-z_][a-z0-9_]*"?|\x00)`)

// endVerb finds a fragment that ends with a write verb, the table's name
// to follow at run time.
var endVerb = regexp.MustCompile(`(?is)\b(insert\s+into|update|delete\s+from|truncate(?:\s+table)?)\s*$`)

// notWrite are the words that, before UPDATE, make it no write of its own
// (SELECT … FOR UPDATE, FOR NO KEY UPDATE, ON CONFLICT … DO UPDATE).
var notWrite = map[string]bool{"for": true, "key": true, "do": true, "on": true}

// write is one statement of the tree that writes a table.
type write struct {
	pkg, pos, table string // table is "" when named at run time
}

// TestOneOwner fails when a production package writes (INSERT, UPDATE,
// DELETE, TRUNCATE, COPY) a table it does not own (owners, sharedWriters),
// or a table named at run time outside dynamicWriters. It reads the SQL as the code
// builds it: string literals and constants, concatenations with +,
// fmt.Sprintf formats with their arguments, fragments ending in a verb
// (a helper adding the name) and pgx CopyFrom. Tests and their fixtures
// may write anything.
func TestOneOwner(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	tables := migrationTables(t, root)
	for _, tb := range tables {
		if owners[tb] == "" {
			t.Errorf("table %s (migrations) has no owner: add it to owners in this test", tb)
		}
	}
	known := map[string]bool{}
	for _, tb := range tables {
		known[tb] = true
	}
	for tb := range owners {
		if !known[tb] {
			t.Errorf("owners lists %s, which no migration creates", tb)
		}
	}
	for tb, pkgs := range sharedWriters {
		for pkg := range pkgs {
			if owners[tb] == "" || owners[tb] == pkg {
				t.Errorf("sharedWriters lists %s for %s, which has no other owner", pkg, tb)
			}
		}
	}
	writes, checked := scanWrites(t, root, known)
	if checked < 50 {
		t.Fatalf("only %d Go files checked under %s; the walk is broken", checked, root)
	}
	for _, w := range writes {
		switch {
		case w.table == "":
			if dynamicWriters[w.pkg] == "" {
				t.Errorf("%s: writes a table named at run time; name it in the SQL so its owner can be checked", w.pos)
			}
		case !known[w.table]:
			t.Errorf("%s: writes %s, which no migration creates", w.pos, w.table)
		case owners[w.table] != w.pkg && sharedWriters[w.table][w.pkg] == "":
			t.Errorf("%s: writes %s, owned by %s; call that package's verbs", w.pos, w.table, owners[w.table])
		}
	}
}

// migrationTables returns the tables migrations/*.sql create, sorted.
func migrationTables(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "migrations", "*.sql"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations under %s: %v", root, err)
	}
	create := regexp.MustCompile(`(?i)\bcreate\s+(?:unlogged\s+)?table\s+(?:if\s+not\s+exists\s+)?(?:public\.)?"?([a-z_][a-z0-9_]*)`)
	set := map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range create.FindAllStringSubmatch(string(src), -1) {
			set[strings.ToLower(m[1])] = true
		}
	}
	out := make([]string, 0, len(set))
	for tb := range set {
		out = append(out, tb)
	}
	sort.Strings(out)
	return out
}

// scanWrites returns the table writes of every production Go file under
// root, and how many files it read.
func scanWrites(t *testing.T, root string, known map[string]bool) ([]write, int) {
	t.Helper()
	dirs := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch name := d.Name(); {
			case path == root:
			case name == "tests", name == "testdata", name == "vendor", strings.HasPrefix(name, "."):
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = append(dirs[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []write
	checked := 0
	for dir, paths := range dirs {
		pkg, _ := filepath.Rel(root, dir)
		pkg = filepath.ToSlash(pkg)
		fset := token.NewFileSet()
		var files []*ast.File
		for _, p := range paths {
			f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		checked += len(files)
		s := &sqlScan{fset: fset, pkg: pkg, root: root, consts: map[string]string{}, known: known}
		for range 2 { // twice: a constant may use one of a later file
			for _, f := range files {
				s.collectConsts(f)
			}
		}
		for _, f := range files {
			s.scan(f)
		}
		out = append(out, s.writes...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pos < out[j].pos })
	return out, checked
}

// dynamic stands for a part of a string known only at run time.
const dynamic = "\x00"

// sqlScan reads the strings one package builds.
type sqlScan struct {
	fset      *token.FileSet
	pkg, root string
	consts    map[string]string // string constants of the package, by name
	known     map[string]bool   // the tables of the migrations
	writes    []write
}

// collectConsts records f's string constants (those whose value is a
// literal or a concatenation of literals and earlier constants).
func (s *sqlScan) collectConsts(f *ast.File) {
	ast.Inspect(f, func(n ast.Node) bool {
		g, ok := n.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			return true
		}
		for _, sp := range g.Specs {
			vs := sp.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if v, ok := s.value(vs.Values[i]); ok && !strings.Contains(v, dynamic) {
						s.consts[name.Name] = v
					}
				}
			}
		}
		return true
	})
}

// value returns the string e builds, with dynamic for the parts known
// only at run time; ok is false when e holds no string literal at all.
func (s *sqlScan) value(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		v, err := strconv.Unquote(e.Value)
		return v, err == nil
	case *ast.Ident:
		v, ok := s.consts[e.Name]
		return v, ok
	case *ast.ParenExpr:
		return s.value(e.X)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		l, lok := s.value(e.X)
		r, rok := s.value(e.Y)
		if !lok && !rok {
			return "", false
		}
		if !lok {
			l = dynamic
		}
		if !rok {
			r = dynamic
		}
		return l + r, true
	case *ast.CallExpr:
		if sel, ok := e.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Sprintf" && len(e.Args) > 0 {
			format, ok := s.value(e.Args[0])
			if !ok {
				return "", false
			}
			return s.sprintf(format, e.Args[1:]), true
		}
	}
	return "", false
}

// sprintf fills format's verbs with args' values, dynamic where unknown.
func (s *sqlScan) sprintf(format string, args []ast.Expr) string {
	var b strings.Builder
	n := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(format) && strings.IndexByte("+-# 0123456789.[]*", format[j]) >= 0 {
			if format[j] == '[' { // an explicit argument index, %[2]s
				if k := strings.IndexByte(format[j:], ']'); k > 0 {
					if x, err := strconv.Atoi(format[j+1 : j+k]); err == nil {
						n = x - 1
					}
				}
			}
			j++
		}
		if j >= len(format) {
			break
		}
		if format[j] == '%' {
			b.WriteByte('%')
		} else {
			v, ok := "", false
			if n < len(args) {
				v, ok = s.value(args[n])
			}
			if !ok {
				v = dynamic
			}
			b.WriteString(v)
			n++
		}
		i = j
	}
	return b.String()
}

// scan records the writes in f's outermost string expressions and its
// pgx CopyFrom calls.
func (s *sqlScan) scan(f *ast.File) {
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GenDecl:
			if n.Tok == token.IMPORT {
				return false
			}
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "CopyFrom" && len(n.Args) > 1 {
				s.copyFrom(n.Args[1])
			}
			if v, ok := s.value(n); ok { // a Sprintf
				s.check(n.Pos(), v)
				return false
			}
		case *ast.BasicLit, *ast.BinaryExpr:
			if v, ok := s.value(n.(ast.Expr)); ok {
				s.check(n.Pos(), v)
				return false // the parts are read with the whole
			}
		}
		return true
	})
}

// copyFrom records the table of a CopyFrom call: a pgx.Identifier literal
// names it, anything else is dynamic.
func (s *sqlScan) copyFrom(e ast.Expr) {
	table := ""
	if cl, ok := e.(*ast.CompositeLit); ok && len(cl.Elts) > 0 {
		if v, ok := s.value(cl.Elts[len(cl.Elts)-1]); ok && !strings.Contains(v, dynamic) {
			table = strings.ToLower(v)
		}
	}
	s.add(e.Pos(), table)
}

// check records the writes of one string the code builds.
func (s *sqlScan) check(pos token.Pos, sql string) {
	for _, m := range tableWrite.FindAllStringSubmatchIndex(sql, -1) {
		verb := strings.ToLower(sql[m[2]:m[3]])
		if verb == "update" && notWrite[prevWord(sql[:m[2]])] {
			continue
		}
		name := strings.ToLower(strings.Trim(sql[m[4]:m[5]], `"`))
		if verb == "copy" && (name == "from" || name == "to") {
			continue
		}
		switch {
		case name == dynamic:
			name = ""
			if !isSQLVerb(sql[m[2]:m[3]]) {
				continue // prose ("could not update " + what), not SQL
			}
		case s.known[name]:
		case !isSQLVerb(sql[m[2]:m[3]]), !tableish(name):
			continue // prose ("update the …") or a keyword, not a table
		}
		s.add(pos, name)
	}
	if m := endVerb.FindStringSubmatchIndex(sql); m != nil && isSQLVerb(sql[m[2]:m[3]]) {
		if !(strings.EqualFold(sql[m[2]:m[3]], "update") && notWrite[prevWord(sql[:m[2]])]) {
			s.add(pos, "")
		}
	}
}

// tableish reports whether name, written after an upper-case verb and not
// a table of the migrations, is to be checked as one: SQL keywords are not.
func tableish(name string) bool {
	switch name {
	case "set", "of", "nowait", "skip", "from", "to":
		return false
	}
	return true
}

// isSQLVerb reports whether verb is written as SQL is in this tree: in
// upper case. Prose says "update" and "insert into" in lower case.
func isSQLVerb(verb string) bool { return verb == strings.ToUpper(verb) }

// prevWord returns the last word of s, lower case.
func prevWord(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return ""
	}
	return strings.ToLower(f[len(f)-1])
}

// add records one write at pos.
func (s *sqlScan) add(pos token.Pos, table string) {
	p := s.fset.Position(pos)
	rel, _ := filepath.Rel(s.root, p.Filename)
	s.writes = append(s.writes, write{pkg: s.pkg, pos: filepath.ToSlash(rel) + ":" + strconv.Itoa(p.Line), table: table})
}

// TestOneOwnerPattern: the scan reads the statement forms in use, built
// however the code builds them, and leaves reads and prose alone.
func TestOneOwnerPattern(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, tb := range migrationTables(t, root) {
		known[tb] = true
	}
	for _, tc := range []struct {
		name, src string
		want      []string // tables written, "" for one named at run time
	}{
		{"update", "`UPDATE requests SET state = $2`", []string{"requests"}},
		{"lower case", "\"update  vgpu_attachments\\n\\tset state\"", []string{"vgpu_attachments"}},
		{"insert", "`INSERT INTO commands (id) VALUES ($1)`", []string{"commands"}},
		{"cte", "`WITH r AS (DELETE FROM decisions WHERE x) SELECT 1`", []string{"decisions"}},
		{"other table", "`INSERT INTO requests_archive (id) VALUES ($1)`", []string{"requests_archive"}},
		{"for update", "`SELECT state FROM requests WHERE id = $1 FOR UPDATE`", nil},
		{"for update skip", "`SELECT id FROM events FOR UPDATE SKIP LOCKED`", nil},
		{"for no key update", "`SELECT 1 FROM requests FOR NO KEY UPDATE`", nil},
		{"join", "`SELECT * FROM commands c JOIN requests r ON r.id = c.request_id`", nil},
		{"upsert", "`INSERT INTO hosts (name) VALUES ($1) ON CONFLICT (name) DO UPDATE SET seen = now()`", []string{"hosts"}},
		{"prose", "\"could not update the request\"", nil},
		{"concat const", "\"INSERT INTO \" + auditTable + \" (actor) VALUES ($1)\"", []string{"audit_log"}},
		{"concat var", "\"DELETE FROM \" + table + \" WHERE id = $1\"", []string{""}},
		{"concat tail", "`SELECT 1 FROM requests WHERE ` + cond + ` FOR UPDATE`", nil},
		{"sprintf const", "fmt.Sprintf(\"UPDATE %s SET x = 1\", auditTable)", []string{"audit_log"}},
		{"sprintf literal", "fmt.Sprintf(`INSERT INTO %s (a) VALUES (%d)`, \"events\", n)", []string{"events"}},
		{"sprintf var", "fmt.Sprintf(`DELETE FROM %s WHERE %s = ANY($1)`, t, c)", []string{""}},
		{"sprintf index", "fmt.Sprintf(`DELETE FROM %[2]s WHERE %[1]s < $1`, col, \"dead_letters\")", []string{"dead_letters"}},
		{"sprintf format const", "fmt.Sprintf(insertAudit, 1)", []string{"audit_log"}},
		{"helper fragment", "exec(ctx, \"INSERT INTO\", name, cols)", []string{""}},
		{"copy", "tx.CopyFrom(ctx, pgx.Identifier{\"events\"}, cols, src)", []string{"events"}},
		{"copy var", "tx.CopyFrom(ctx, pgx.Identifier{name}, cols, src)", []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "package p\nconst auditTable = \"audit_log\"\nconst insertAudit = `INSERT INTO ` + auditTable + ` (n) VALUES (%d)`\nfunc f() { _ = " + tc.src + " }\n"
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "p.go", src, 0)
			if err != nil {
				t.Fatal(err)
			}
			s := &sqlScan{fset: fset, pkg: "p", root: ".", consts: map[string]string{}, known: known}
			s.collectConsts(f)
			// Only the function's body: the constants are read through it.
			s.scan(&ast.File{Name: f.Name, Decls: f.Decls[len(f.Decls)-1:]})
			var got []string
			for _, w := range s.writes {
				got = append(got, w.table)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") || len(got) != len(tc.want) {
				t.Errorf("%s: writes %q, want %q", tc.src, got, tc.want)
			}
		})
	}
}
