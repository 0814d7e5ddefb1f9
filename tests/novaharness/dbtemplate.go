package novaharness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/vgpu-bridge/vgpu-bridge/tests/testsvc"
)

// Nova's schema migrations (nova-manage api_db sync, then db sync) take
// 90–120 s of one core at every start; the schema only changes with the
// installed Nova. The first start on a machine keeps its freshly migrated
// databases as two Postgres template databases, named after a digest of
// Nova's migration scripts; every later start copies them (CREATE
// DATABASE … TEMPLATE, well under a second) and runs only what writes
// rows: cell_v2 map_cell0 and create_cell. A Nova package upgrade changes
// the digest, so the next start migrates again and keeps new templates.

// templateNames are the api and main (cell0, cell1) template databases of
// the installed Nova, or "" when its migrations cannot be read; worked out
// once per test binary.
var templateNames = sync.OnceValues(readTemplateNames)

func readTemplateNames() (api, main string) {
	dir := filepath.Join(novaPackageDir(), "db")
	var files []string
	for _, sub := range []string{"api/migrations/versions", "main/migrations/versions"} {
		ms, _ := filepath.Glob(filepath.Join(dir, sub, "*.py"))
		files = append(files, ms...)
	}
	if len(files) == 0 {
		return "", ""
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", ""
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(f), len(b))
		h.Write(b)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:12]
	return "novatpl_" + sum + "_api", "novatpl_" + sum + "_main"
}

// novaPackageDir is where Python imports nova from.
func novaPackageDir() string {
	out, err := exec.Command(Python, "-c", "import os, nova; print(os.path.dirname(nova.__file__))").Output()
	if err != nil {
		return "/usr/lib/python3/dist-packages/nova"
	}
	return strings.TrimSpace(string(out))
}

// templateLock serialises template creation between processes (the test
// packages run in parallel); pg_advisory_lock waits for the holder.
const templateLock = 0x6e6f7661 // "nova"

// createFromTemplates creates the three databases of n from the templates
// and reports whether it could; false (and no database created) when no
// complete template exists yet.
func (n *Nova) createFromTemplates(ctx context.Context, conn *pgx.Conn) (bool, error) {
	api, main := templateNames()
	if api == "" {
		return false, nil
	}
	var ready int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datistemplate AND datname IN ($1, $2)", api, main).Scan(&ready); err != nil {
		return false, fmt.Errorf("look for Nova's template databases: %w", err)
	}
	if ready != 2 {
		return false, nil
	}
	for _, c := range []struct{ cell, from string }{{"api", api}, {"cell0", main}, {"cell1", main}} {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+n.dbName(c.cell)+" TEMPLATE "+c.from); err != nil {
			return false, fmt.Errorf("create database %s from %s: %w", n.dbName(c.cell), c.from, err)
		}
		n.dbs = append(n.dbs, n.dbName(c.cell))
	}
	return true, nil
}

// keepTemplates copies n's freshly migrated databases (before any Nova
// service has connected) into the templates, unless another process did
// first. The api template loses its cell mappings: they name n's
// databases. Best effort: a failure only means the next start migrates.
func (n *Nova) keepTemplates(ctx context.Context) error {
	api, main := templateNames()
	if api == "" {
		return nil
	}
	conn, err := pgx.Connect(ctx, testsvc.PostgresAdminURL())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLock); err != nil {
		return err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", templateLock)
	var ready int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datistemplate AND datname IN ($1, $2)", api, main).Scan(&ready); err != nil {
		return err
	}
	if ready == 2 {
		return nil
	}
	// Leftovers of a run that died half way.
	for _, d := range []string{api, main} {
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+d+" IS_TEMPLATE false"); err != nil && !isUndefinedDatabase(err) {
			return err
		}
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+d+" WITH (FORCE)"); err != nil {
			return err
		}
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+api+" TEMPLATE "+n.dbName("api")); err != nil {
		return fmt.Errorf("copy %s: %w", n.dbName("api"), err)
	}
	u, err := url.Parse(testsvc.PostgresAdminURL())
	if err != nil {
		return err
	}
	u.Path = "/" + api
	tc, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return fmt.Errorf("connect to %s: %w", api, err)
	}
	_, err = tc.Exec(ctx, "DELETE FROM cell_mappings")
	tc.Close(ctx)
	if err != nil {
		return fmt.Errorf("clear the cell mappings of %s: %w", api, err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+main+" TEMPLATE "+n.dbName("cell1")); err != nil {
		return fmt.Errorf("copy %s: %w", n.dbName("cell1"), err)
	}
	// Marked last: a template is used only when both are marked.
	for _, d := range []string{api, main} {
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+d+" IS_TEMPLATE true"); err != nil {
			return err
		}
	}
	return nil
}

func isUndefinedDatabase(err error) bool {
	var pe interface{ SQLState() string }
	return errors.As(err, &pe) && pe.SQLState() == "3D000"
}
